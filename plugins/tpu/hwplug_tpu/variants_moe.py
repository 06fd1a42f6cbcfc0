"""hwplug-tpu's mixture-of-experts variants: ``moe_topk``, ``moe_experts`` and ``fused_moe``
as the jitted JAX functions of :mod:`hwplug_tpu.moe` (tokens sorted by expert, grouped
matmuls through ``jax.lax.ragged_dot``).

Each takes and returns what the op's reference does (:mod:`hwplug.kernel_registry.ops_moe`;
``moe_topk``'s ids int64) and checks its arguments with the reference's checks (an
:class:`~hwplug.errors.UnsupportedError` naming the problem). Tokens are padded to a
bucket (padding rows route somewhere and contribute zero rows, which are dropped), so a
batch size compiles once per bucket; inside a recorded step (:func:`hwplug_tpu.step.recording`)
they record their JAX function instead (the ids then stay int32 on the device).
"""

from __future__ import annotations

from typing import Any

import torch

from hwplug.kernel_registry.moe_compose import fused_supported
from hwplug.kernel_registry.reference.moe import check_experts, check_routing, check_shared
from hwplug_tpu import moe
from hwplug_tpu.bridge import padded, to_jax, to_torch
from hwplug_tpu.step import recording
from hwplug_tpu.variants import bucket_rows


def _optional(tensor: torch.Tensor | None) -> Any:
    return None if tensor is None else to_jax(tensor)


def _routing(router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str,
             correction_bias: torch.Tensor | None, num_expert_group: int | None,
             topk_group: int | None, routed_scaling_factor: float) -> dict[str, Any]:
    """:func:`hwplug_tpu.moe.route`'s static options, after the reference's checks."""
    check_routing(router_logits, top_k, scoring, correction_bias, num_expert_group, topk_group)
    return dict(top_k=top_k, renormalize=bool(renormalize), scoring=scoring,
                num_expert_group=num_expert_group, topk_group=topk_group,
                routed_scaling_factor=float(routed_scaling_factor))


def moe_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool = True, *,
             scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
             num_expert_group: int | None = None, topk_group: int | None = None,
             routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``moe_topk`` op in JAX: ``(weights [T, k] fp32, ids [T, k] int64)``."""
    routing = _routing(router_logits, top_k, renormalize, scoring, correction_bias,
                       num_expert_group, topk_group, routed_scaling_factor)
    if (rec := recording()) is not None:
        return rec.call(moe.route, router_logits, correction_bias, **routing)
    rows, n = bucket_rows(router_logits)
    weights, ids = moe.route_jit(to_jax(rows), _optional(correction_bias), **routing)
    return to_torch(weights)[:n], to_torch(ids)[:n].long()


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """The ``moe_experts`` op in JAX: ``[T, H]`` in ``x.dtype``."""
    check_experts(x, w13, w2, topk_weights, topk_ids, activation)
    if (rec := recording()) is not None:
        return rec.call(moe.experts, x, w13, w2, topk_weights, topk_ids, activation=activation)
    rows, n = bucket_rows(x)
    size = rows.shape[0]
    out = moe.experts(to_jax(rows), to_jax(w13), to_jax(w2), to_jax(padded(topk_weights, size)),
                      to_jax(padded(topk_ids, size)), activation=activation)
    return to_torch(out)[:n]


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, top_k: int, renormalize: bool = True, *,
              scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
              num_expert_group: int | None = None, topk_group: int | None = None,
              routed_scaling_factor: float = 1.0, activation: str = "silu",
              shared_w13: torch.Tensor | None = None,
              shared_w2: torch.Tensor | None = None) -> torch.Tensor:
    """The ``fused_moe`` op in JAX, routing, experts and shared experts in one jitted
    function: ``[T, H]`` in ``x.dtype``."""
    routing = _routing(router_logits, top_k, renormalize, scoring, correction_bias,
                       num_expert_group, topk_group, routed_scaling_factor)
    check_shared(shared_w13, shared_w2)
    slots = router_logits.new_empty((x.shape[0], top_k))
    check_experts(x, w13, w2, slots, slots, activation)
    if (rec := recording()) is not None:
        return rec.call(moe.fused, x, router_logits, w13, w2, correction_bias, shared_w13,
                        shared_w2, activation=activation, **routing)
    rows, n = bucket_rows(x)
    out = moe.fused(to_jax(rows), to_jax(padded(router_logits, rows.shape[0])), to_jax(w13),
                    to_jax(w2), _optional(correction_bias), _optional(shared_w13),
                    _optional(shared_w2), activation=activation, **routing)
    return to_torch(out)[:n]


def experts_supported(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *args: Any,
                      **kwargs: Any) -> str | None:
    """Why :func:`moe_experts` declines a call (expert weights not in ``x``'s dtype), or
    None."""
    return fused_supported(x, x, w13, w2)
