"""``fused_moe``: the registry's ``moe_topk``, then ``moe_experts`` (this library's grouped
GEMMs, :mod:`hwplug_triton.kernels.moe`), then the shared experts through ``linear`` and
the gated activation (:func:`hwplug.kernel_registry.moe_compose.fused_moe`).

supports: expert weights in x's dtype; see :func:`supported`.
"""

from __future__ import annotations

from typing import Any

import torch

from hwplug.kernel_registry import moe_compose
from hwplug_triton.kernels import checked


def supported(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, *args: Any, **kwargs: Any) -> str | None:
    """Why this composition cannot serve the call, or None."""
    return moe_compose.fused_supported(x, router_logits, w13, w2)


@checked(supported)
def fused_moe(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The ``fused_moe`` op (see the module docstring)."""
    return moe_compose.fused_moe(*args, **kwargs)
