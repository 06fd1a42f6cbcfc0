"""The mixture-of-experts layer: a router and stacked experts, the ``fused_moe`` op bound from
the model's kernel plan.

:class:`FusedMoE` holds the router ``gate`` (a :class:`~.linear.Linear` of ``E`` outputs)
and ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``, transformers'
(5.x) names and layout; :func:`stack_experts` turns a checkpoint's per-expert tensors
(``experts.<e>.gate_proj.weight``, ..., or Mixtral's ``w1`` / ``w3`` / ``w2``) into those
stacks while the weights stream past.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hwplug.dtypes import dtype_name
from hwplug.errors import ModelError, UnsupportedError
from hwplug.model_zoo.layers.linear import Linear

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

__all__ = ["FusedMoE", "MoEExperts", "stack_experts"]

#: Per-expert checkpoint names: ``<prefix>.experts.<e>.<projection>.weight``.
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\."
                         r"(?P<part>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
#: Projection name -> its part of the stacks (Mixtral's w1 / w3 / w2 are gate / up / down).
_PARTS = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
          "down_proj": "down", "w2": "down"}


class MoEExperts(nn.Module):
    """``gate_up_proj [E, 2I, H]`` (each expert's gate rows, then its up rows) and
    ``down_proj [E, H, I]`` in the model dtype."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype),
            requires_grad=False)
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype),
            requires_grad=False)


class FusedMoE(nn.Module):
    """``x [T, H]`` -> ``[T, H]``: router logits ``gate(x)``, then the ``fused_moe`` op.

    ``routing`` are ``moe_topk``'s options (``scoring``, ``num_expert_group``,
    ``topk_group``, ``routed_scaling_factor``); ``correction_bias=True`` adds the
    parameter ``gate.e_score_correction_bias [E]`` (DeepSeek-V3). ``activation`` is
    ``silu`` or ``gelu``. Tensor parallelism (and expert parallelism) is not supported yet.
    """

    def __init__(self, ctx: ModelContext, *, num_experts: int, top_k: int, hidden_size: int,
                 intermediate_size: int, renormalize: bool = True, activation: str = "silu",
                 correction_bias: bool = False, **routing: Any) -> None:
        super().__init__()
        if ctx.parallel.size > 1:
            raise UnsupportedError(f"{type(self).__name__} runs on one rank: tensor and "
                                   f"expert parallelism of experts is not supported yet")
        self.top_k, self.renormalize, self.activation = top_k, renormalize, activation
        self.routing = routing
        self.gate = Linear(hidden_size, num_experts, ctx)
        if correction_bias:
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)
        self.experts = MoEExperts(num_experts, hidden_size, intermediate_size, ctx.dtype)
        self.fused_moe = ctx.kernels.bind("fused_moe", dtype_name(ctx.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = getattr(self.gate, "e_score_correction_bias", None)
        return self.fused_moe(x, self.gate(x), self.experts.gate_up_proj,
                              self.experts.down_proj, self.top_k, self.renormalize,
                              activation=self.activation, correction_bias=bias,
                              **self.routing)

    def extra_repr(self) -> str:
        experts, rows, hidden = self.experts.gate_up_proj.shape
        return (f"experts={experts}, top_k={self.top_k}, hidden={hidden}, "
                f"intermediate={rows // 2}, renormalize={self.renormalize}")


def stack_experts(weights: Iterable[tuple[str, torch.Tensor]], num_experts: int
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with each layer's per-expert projections replaced by the stacks
    ``<prefix>.gate_up_proj`` and ``<prefix>.down_proj``, yielded once the layer's
    ``num_experts`` experts have all been seen; other tensors pass through. Raises
    :class:`ModelError` naming the experts a layer lacks at the end."""
    pending: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    for name, tensor in weights:
        match = _PER_EXPERT.match(name)
        if match is None:
            yield name, tensor
            continue
        expert = int(match["expert"])
        if expert >= num_experts:
            raise ModelError(f"checkpoint tensor {name}: expert {expert} of a model with "
                             f"{num_experts} experts")
        parts = pending.setdefault(match["prefix"], {})
        parts[(_PARTS[match["part"]], expert)] = tensor
        if len(parts) == 3 * num_experts:
            del pending[match["prefix"]]
            yield f"{match['prefix']}.gate_up_proj", torch.stack(
                [torch.cat([parts[("gate", e)], parts[("up", e)]]) for e in range(num_experts)])
            yield f"{match['prefix']}.down_proj", torch.stack(
                [parts[("down", e)] for e in range(num_experts)])
    for prefix, parts in pending.items():
        missing = sorted(f"{part} of expert {e}" for part in ("gate", "up", "down")
                         for e in range(num_experts) if (part, e) not in parts)
        raise ModelError(f"checkpoint lacks {prefix}: {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''}")
