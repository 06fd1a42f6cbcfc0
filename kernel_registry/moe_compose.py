"""``fused_moe`` composed of the registry's ops, for a platform whose speed is in its
``moe_experts`` variant: ``moe_topk``, then ``moe_experts``, then the shared experts
through ``linear`` and the gated activation op. The cpu platform and hwplug-triton
register it as their ``fused_moe`` variant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hwplug.kernel_registry import ops
from hwplug.kernel_registry.ops_moe import moe_experts, moe_topk
from hwplug.kernel_registry.reference.moe import check_shared


def gated(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The registry's gated activation op for ``activation`` (``silu`` or ``gelu``)."""
    if activation == "silu":
        return ops.silu_and_mul
    return lambda h: ops.gelu_and_mul(h, "none")


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, top_k: int, renormalize: bool = True, *,
              activation: str = "silu", shared_w13: torch.Tensor | None = None,
              shared_w2: torch.Tensor | None = None, **routing: Any) -> torch.Tensor:
    """The ``fused_moe`` op through the registry's ops (see the module docstring)."""
    check_shared(shared_w13, shared_w2)
    weights, ids = moe_topk(router_logits, top_k, renormalize, **routing)
    out = moe_experts(x, w13, w2, weights, ids, activation)
    if shared_w13 is None:
        return out
    return out + ops.linear(gated(activation)(ops.linear(x, shared_w13)), shared_w2)


def fused_supported(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
                    w2: torch.Tensor, *args: Any, **kwargs: Any) -> str | None:
    """Why :func:`fused_moe` declines a call, or None: expert weights in ``x``'s dtype
    (the ``linear`` op of the shared experts and most ``moe_experts`` kernels need it)."""
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        return f"needs w13 and w2 in x's dtype {x.dtype}, got {w13.dtype} and {w2.dtype}"
    return None
