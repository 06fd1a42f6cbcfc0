"""Gated activations: ``act(x[..., :d]) * x[..., d:]`` for the MLP's fused gate/up output."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hwplug.errors import UnsupportedError


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x [..., 2d] -> [..., d]`` = ``silu(x[..., :d]) * x[..., d:]``, fp32 inside, ``x.dtype`` out."""
    return _gated(x, F.silu)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``x [..., 2d] -> [..., d]`` = ``gelu(x[..., :d], approximate) * x[..., d:]``.

    ``approximate`` is ``"none"`` (erf form) or ``"tanh"``, as in ``torch.nn.functional.gelu``
    (which raises on any other value). fp32 inside, ``x.dtype`` out.
    """
    return _gated(x, lambda gate: F.gelu(gate, approximate=approximate))


def _gated(x: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise UnsupportedError(f"gated activation needs an even last dimension, got "
                               f"{tuple(x.shape)}")
    gate, up = x.float().chunk(2, dim=-1)
    return (activation(gate) * up).to(x.dtype)
