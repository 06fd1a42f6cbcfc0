"""Gated activations: ``act(x[..., :d]) * x[..., d:]``, the op bound from the model's
kernel plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.errors import ConfigError
from hwplug.model_zoo.kernel_binding import bind

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext


class SiluAndMul(nn.Module):
    """``x [..., 2d]`` -> ``silu(x[..., :d]) * x[..., d:]`` ``[..., d]`` (``silu_and_mul``)."""

    def __init__(self, ctx: ModelContext | None = None) -> None:
        super().__init__()
        self.silu_and_mul, _ = bind(ctx, "SiluAndMul", "silu_and_mul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.silu_and_mul(x)


class GeluAndMul(nn.Module):
    """``x [..., 2d]`` -> ``gelu(x[..., :d], approximate) * x[..., d:]`` (``gelu_and_mul``);
    ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""

    def __init__(self, approximate: str = "none", ctx: ModelContext | None = None) -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ConfigError(f"approximate must be 'none' or 'tanh', not {approximate!r}")
        self.approximate = approximate
        self.gelu_and_mul, _ = bind(ctx, "GeluAndMul", "gelu_and_mul")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu_and_mul(x, self.approximate)
