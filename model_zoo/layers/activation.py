"""Gated activations through the kernel registry: ``act(x[..., :d]) * x[..., d:]``."""

from __future__ import annotations

import torch
from torch import nn

from hwplug.errors import ConfigError
from hwplug.kernel_registry import ops


class SiluAndMul(nn.Module):
    """``x [..., 2d]`` -> ``silu(x[..., :d]) * x[..., d:]`` ``[..., d]`` (``ops.silu_and_mul``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)


class GeluAndMul(nn.Module):
    """``x [..., 2d]`` -> ``gelu(x[..., :d], approximate) * x[..., d:]`` (``ops.gelu_and_mul``);
    ``approximate`` is ``"none"`` (erf) or ``"tanh"``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ConfigError(f"approximate must be 'none' or 'tanh', not {approximate!r}")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.gelu_and_mul(x, self.approximate)
