"""Gated activations ``act(x[..., :d]) * x[..., d:]`` in one Triton kernel.

Contracts (the ``silu_and_mul`` and ``gelu_and_mul`` ops): ``x [..., 2d] -> [..., d]``;
``gelu_and_mul``'s ``approximate`` is ``"none"`` (erf form) or ``"tanh"``. fp32 inside,
output in ``x.dtype``. The activation is a compile-time parameter of the one kernel.

supports: any float dtype and any even last dimension; see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.kernels.functions import tanh
from hwplug_triton.tuning import launch_config

#: Activation name -> the kernel's ``ACTIVATION`` constant.
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def supported(x: torch.Tensor, approximate: str = "none") -> str | None:
    """Why this kernel cannot serve the call (of either op), or None."""
    if x.dim() == 0 or x.shape[-1] % 2:
        return f"needs an even last dimension, got shape {tuple(x.shape)}"
    if approximate not in GELU_APPROXIMATIONS:
        return f"approximate must be one of {', '.join(GELU_APPROXIMATIONS)}, got {approximate!r}"
    return None


@checked(supported)
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]``."""
    return _gated(x, "silu")


@checked(supported)
def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(x[..., :d], approximate) * x[..., d:]``."""
    return _gated(x, GELU_APPROXIMATIONS[approximate])


def _gated(x: torch.Tensor, activation: str) -> torch.Tensor:
    width = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * width).contiguous()
    out = rows.new_empty((rows.shape[0], width))
    if out.numel():
        config = launch_config("gated_activation", x.device, width)
        block = min(config["block"], triton.next_power_of_2(width))
        _gated_kernel[(rows.shape[0], triton.cdiv(width, block))](
            rows, out, width, ACTIVATION=ACTIVATIONS[activation], BLOCK=block,
            num_warps=config["num_warps"])
    return out.view(*x.shape[:-1], width)


@triton.jit
def _gated_kernel(x_ptr, out_ptr, width, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate = tl.load(x_ptr + row * 2 * width + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * width + width + cols, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:  # silu
        act = gate / (1.0 + tl.exp(-gate))
    elif ACTIVATION == 1:  # gelu, erf form
        act = 0.5 * gate * (1.0 + tl.erf(gate * 0.7071067811865476))
    else:  # gelu, tanh form
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (1.0 + tanh(inner))
    tl.store(out_ptr + row * width + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)
