"""The mixture-of-experts layer: a router and stacked experts, the ``fused_moe`` op bound from
the model's kernel plan.

:class:`FusedMoE` holds the router ``gate`` (a :class:`~.linear.Linear` of ``E`` outputs)
and ``experts.gate_up_proj [E, 2I, H]`` / ``experts.down_proj [E, H, I]``, transformers'
(5.x) names and layout; :func:`stack_experts` turns a checkpoint's per-expert tensors
(``experts.<e>.gate_proj.weight``, ..., or Mixtral's ``w1`` / ``w3`` / ``w2``) into those
stacks while the weights stream past.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hwplug.dtypes import dtype_name
from hwplug.errors import ModelError, UnsupportedError
from hwplug.kernel_registry.reference.ggml import row_values, type_name
from hwplug.model_zoo.layers.activation import SiluAndMul
from hwplug.model_zoo.layers.expert_parallel import ExpertRouter, held_experts
from hwplug.model_zoo.layers.linear import FusedLinear, Linear, copy_checked
from hwplug.model_zoo.layers.moe_quant import ScaledExperts, expert_format
from hwplug.model_zoo.quant_methods.unquantized import UnquantizedLinearMethod

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

__all__ = ["FusedMoE", "GgufExperts", "MoEExperts", "SharedExperts", "stack_experts"]

#: Per-expert checkpoint names: ``<prefix>.experts.<e>.<projection>.<tensor>``, the
#: tensor a weight or its scales (fp8 ``weight_scale_inv``, int8 ``weight_scale``).
_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\."
                         r"(?P<part>gate_proj|up_proj|down_proj|w1|w3|w2)\."
                         r"(?P<tensor>weight|weight_scale_inv|weight_scale)$")
#: A per-expert tensor -> the suffix of its stack's name (``gate_up_proj<suffix>``).
_STACK_SUFFIX = {"weight": "", "weight_scale_inv": "_scale_inv", "weight_scale": "_scale"}
#: Projection name -> its part of the stacks (Mixtral's w1 / w3 / w2 are gate / up / down).
_PARTS = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up",
          "down_proj": "down", "w2": "down"}


class MoEExperts(nn.Module):
    """``gate_up_proj [E, 2I, H]`` (each expert's gate rows, then its up rows) and
    ``down_proj [E, H, I]`` in the model dtype, of the checkpoint's ``num_experts`` those in
    ``held`` (default: all; a rank's share under expert parallelism), ``E = len(held)``."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 dtype: torch.dtype, held: range | None = None) -> None:
        super().__init__()
        self.total, self.held = num_experts, held or range(num_experts)
        num_experts = len(self.held)
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype),
            requires_grad=False)
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype),
            requires_grad=False)

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        copy_checked(getattr(self, param_name), held_experts(tensor, self.total, self.held),
                     param_name)


class GgufExpertStack(nn.Module):
    """One stacked projection of GGUF experts: ``qweight`` (``uint8 [E, rows, row_bytes]``,
    each expert's rows as the file stores them) and ``qweight_type``, taken as loaded (a
    view of the mapped file stays one)."""

    def __init__(self, total: int, held: range) -> None:
        super().__init__()
        self.total, self.held = total, held
        for name, dtype in (("qweight", torch.uint8), ("qweight_type", torch.int32)):
            self.register_parameter(name, nn.Parameter(torch.empty(0, dtype=dtype),
                                                       requires_grad=False))

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        getattr(self, param_name).data = (held_experts(tensor, self.total, self.held)
                                          if param_name == "qweight" else tensor)

    def checked(self, experts: int, rows: int, values: int) -> tuple[torch.Tensor, int]:
        """``(qweight, type)``, after checking they hold ``experts`` x ``rows`` rows of
        ``values`` values (:class:`ModelError` otherwise)."""
        kind = int(self.qweight_type.reshape(-1)[0])
        shape = tuple(self.qweight.shape)
        if len(shape) != 3 or shape[:2] != (experts, rows) or \
                row_values(kind, shape[2]) != values:
            raise ModelError(f"GGUF experts of type {type_name(kind)} and shape {shape} do "
                             f"not hold {experts} experts of {rows} rows of {values} values")
        return self.qweight, kind


class GgufExperts(nn.Module):
    """``gate_up_proj`` and ``down_proj`` as :class:`GgufExpertStack`: the ``gguf`` quant
    method's experts (of ``num_experts``, those in ``held``: default all), multiplied by
    ``ggml_moe_experts`` in their blocks."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 held: range | None = None) -> None:
        super().__init__()
        self.held = held = held or range(num_experts)
        self.sizes = (len(held), hidden_size, intermediate_size)
        self.gate_up_proj = GgufExpertStack(num_experts, held)
        self.down_proj = GgufExpertStack(num_experts, held)
        self._stacks: tuple[torch.Tensor, int, torch.Tensor, int] | None = None

    def stacks(self) -> tuple[torch.Tensor, int, torch.Tensor, int]:
        """``ggml_moe_experts``'s ``(w13, w13_type, w2, w2_type)``, checked once."""
        if self._stacks is None:
            experts, hidden, intermediate = self.sizes
            self._stacks = (*self.gate_up_proj.checked(experts, 2 * intermediate, hidden),
                            *self.down_proj.checked(experts, hidden, intermediate))
        return self._stacks


class SharedExperts(nn.Module):
    """The always-active experts of a DeepSeek-style block, as one gated MLP:
    ``down_proj(silu(gate_proj(x)) * up_proj(x))``, gate and up fused into ``gate_up_proj``
    (checkpoint names ``shared_experts.{gate,up,down}_proj.weight``; the model routes
    ``gate_proj`` / ``up_proj`` to the shards), weights from the quant method. Under tensor
    parallelism each rank holds a share of the intermediate size (gate/up column-parallel,
    down row-parallel), as the dense MLP does."""

    def __init__(self, hidden_size: int, intermediate_size: int, ctx: ModelContext) -> None:
        super().__init__()
        first, local = ctx.parallel.share(intermediate_size, "shared experts' intermediate size")
        rows = (first, local, intermediate_size)
        self.gate_up_proj = FusedLinear(
            hidden_size, {"gate": local, "up": local}, ctx,
            source_rows={"gate": rows, "up": rows} if ctx.parallel.size > 1 else None)
        self.act = SiluAndMul(ctx)
        self.down_proj = Linear(intermediate_size, hidden_size, ctx, parallel="row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class FusedMoE(nn.Module):
    """``x [T, H]`` -> ``[T, H]``: router logits ``gate(x)``, then the ``fused_moe`` op.

    ``routing`` are ``moe_topk``'s options (``scoring``, ``num_expert_group``,
    ``topk_group``, ``routed_scaling_factor``); ``correction_bias=True`` adds the
    parameter ``gate.e_score_correction_bias [E]`` (DeepSeek-V3). ``activation`` is
    ``silu`` or ``gelu``. ``shared_intermediate_size`` adds ``shared_experts``
    (:class:`SharedExperts`, DeepSeek's), whose output is added unweighted. Under the
    ``gguf`` quant method the experts stay in their blocks
    (:class:`GgufExperts`: ``moe_topk``, then ``ggml_moe_experts``); under ``fp8`` with
    block scales and ``int8`` W8A8 they stay fp8 / int8 with their scales
    (:class:`~.moe_quant.ScaledExperts`: ``moe_topk``, then ``fp8_moe_experts`` /
    ``int8_moe_experts``) and the router ``gate`` is unquantized, as those checkpoints
    store it; other formats are refused. Under tensor parallelism the layer needs expert parallelism
    (``enable_expert_parallel``): each rank holds a share of the experts and tokens move
    to them (:class:`~.expert_parallel.ExpertRouter`); the shared experts split like a
    dense MLP.
    """

    def __init__(self, ctx: ModelContext, *, num_experts: int, top_k: int, hidden_size: int,
                 intermediate_size: int, renormalize: bool = True, activation: str = "silu",
                 correction_bias: bool = False, shared_intermediate_size: int | None = None,
                 **routing: Any) -> None:
        super().__init__()
        tp = ctx.parallel
        if tp.size > 1 and not tp.expert_parallel:
            raise UnsupportedError(f"{type(self).__name__}: mixture-of-experts layers split over "
                                   f"ranks by whole experts only: pass "
                                   f"enable_expert_parallel=True (--enable-expert-parallel) "
                                   f"with tensor_parallel_size={tp.size}")
        self.router = ExpertRouter(tp, num_experts) if tp.size > 1 else None
        first, count = tp.experts(num_experts) if self.router else (0, num_experts)
        held = range(first, first + count)
        dtype, quant = dtype_name(ctx.dtype), ctx.quant_method.get_name()
        fmt = expert_format(ctx.quant_method)
        self.top_k, self.renormalize, self.activation = top_k, renormalize, activation
        self.routing = routing
        self.gate = Linear(hidden_size, num_experts, ctx if fmt is None else dataclasses.replace(
            ctx, quant_method=UnquantizedLinearMethod()))
        if correction_bias:
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)
        self.experts: nn.Module
        if quant == "gguf":
            self.experts = GgufExperts(num_experts, hidden_size, intermediate_size, held)
            self.moe_experts = ctx.kernels.bind("ggml_moe_experts", dtype)
        elif fmt is not None:
            self.experts = ScaledExperts(fmt, num_experts, hidden_size, intermediate_size, held,
                                         ctx.quant_method.scheme.weight.group_shape)
            self.moe_experts = ctx.kernels.bind(self.experts.op, dtype)
        else:
            self.experts = MoEExperts(num_experts, hidden_size, intermediate_size, ctx.dtype,
                                      held)
            self.moe_experts = ctx.kernels.bind("moe_experts", dtype)
        if quant == "gguf" or fmt is not None or self.router:  # routing, then the experts
            self.moe_topk = ctx.kernels.bind("moe_topk", dtype)
        else:
            self.fused_moe = ctx.kernels.bind("fused_moe", dtype)
        self.sizes = (num_experts, hidden_size, intermediate_size)
        if shared_intermediate_size:
            self.shared_experts = SharedExperts(hidden_size, shared_intermediate_size, ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._routed(x)
        shared = getattr(self, "shared_experts", None)
        return out if shared is None else out + shared(x)

    def _routed(self, x: torch.Tensor) -> torch.Tensor:
        if self.router is not None:
            return self.router(x, self._route, self._experts)
        if isinstance(self.experts, (GgufExperts, ScaledExperts)):
            return self._experts(x, *self._route(x))
        return self.fused_moe(x, self.gate(x), self.experts.gate_up_proj,
                              self.experts.down_proj, self.top_k, self.renormalize,
                              activation=self.activation, **self._routing())

    def _routing(self) -> dict[str, Any]:
        return {**self.routing,
                "correction_bias": getattr(self.gate, "e_score_correction_bias", None)}

    def _route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``moe_topk`` of ``x``'s router logits: ``(weights, ids)``, ``[T, top_k]`` each."""
        return self.moe_topk(self.gate(x), self.top_k, self.renormalize, **self._routing())

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
                 ) -> torch.Tensor:
        """The held experts on ``x`` for the slots ``(weights, ids)`` (ids among them)."""
        if isinstance(self.experts, GgufExperts):
            return self.moe_experts(x, *self.experts.stacks(), weights, ids, self.activation)
        if isinstance(self.experts, ScaledExperts):
            return self.moe_experts(x, *self.experts.stacks(), weights, ids, self.activation,
                                    **self.experts.options)
        return self.moe_experts(x, self.experts.gate_up_proj, self.experts.down_proj,
                                weights, ids, self.activation)

    def extra_repr(self) -> str:
        experts, hidden, intermediate = self.sizes
        return (f"experts={experts}, top_k={self.top_k}, hidden={hidden}, "
                f"intermediate={intermediate}, renormalize={self.renormalize}")


def stack_experts(weights: Iterable[tuple[str, torch.Tensor]], num_experts: int
                  ) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` with each layer's per-expert projections replaced by the stacks
    ``<prefix>.gate_up_proj`` and ``<prefix>.down_proj``, yielded once the layer's
    ``num_experts`` experts have all been seen; their scales, where quantized, likewise
    (``gate_up_proj_scale_inv`` from fp8's ``weight_scale_inv``, ``gate_up_proj_scale``
    from ``weight_scale``). Other tensors pass through. Raises :class:`ModelError` naming
    the experts a layer lacks at the end."""
    pending: dict[tuple[str, str], dict[tuple[str, int], torch.Tensor]] = {}
    for name, tensor in weights:
        match = _PER_EXPERT.match(name)
        if match is None:
            yield name, tensor
            continue
        expert = int(match["expert"])
        if expert >= num_experts:
            raise ModelError(f"checkpoint tensor {name}: expert {expert} of a model with "
                             f"{num_experts} experts")
        key = (match["prefix"], match["tensor"])
        parts = pending.setdefault(key, {})
        parts[(_PARTS[match["part"]], expert)] = tensor
        if len(parts) == 3 * num_experts:
            del pending[key]
            prefix, suffix = match["prefix"], _STACK_SUFFIX[match["tensor"]]
            yield f"{prefix}.gate_up_proj{suffix}", torch.stack(
                [torch.cat([parts[("gate", e)], parts[("up", e)]]) for e in range(num_experts)])
            yield f"{prefix}.down_proj{suffix}", torch.stack(
                [parts[("down", e)] for e in range(num_experts)])
    for (prefix, tensor_name), parts in pending.items():
        what = "" if tensor_name == "weight" else f" {tensor_name}"
        missing = sorted(f"{part}{what} of expert {e}" for part in ("gate", "up", "down")
                         for e in range(num_experts) if (part, e) not in parts)
        raise ModelError(f"checkpoint lacks {prefix}: {', '.join(missing[:8])}"
                         f"{' ...' if len(missing) > 8 else ''}")
