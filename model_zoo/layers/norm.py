"""Normalisation layers. :class:`RMSNorm` runs the ``rms_norm`` op (with the fused residual
add), bound from the model's kernel plan; BERT's LayerNorm is :class:`torch.nn.LayerNorm`
itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.model_zoo.kernel_binding import bind

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x**2, -1) + eps) * weight`` over the last dim of size ``hidden_size``.

    ``forward(x)`` returns the normalised tensor; ``forward(x, residual)`` first forms
    ``s = x + residual`` and returns ``(rms_norm(s), s)``: the residual stream for the
    next block comes out of the same kernel.
    """

    def __init__(self, hidden_size: int, eps: float, ctx: ModelContext) -> None:
        super().__init__()
        self.eps = eps
        self.rms_norm, dtype = bind(ctx, "RMSNorm", "rms_norm")
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.rms_norm(x, self.weight, self.eps, residual)
