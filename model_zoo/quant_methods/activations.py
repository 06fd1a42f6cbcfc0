"""Quantizing activations on the fly, as a :class:`~hwplug.ScaleDescriptor` says.

``quantize(x, descriptor, static_scale)`` returns ``(values, scale)`` with ``x ~= values *
scale`` block by block, in the layout the ``scaled_mm`` op reads: one scale (per tensor),
``[M, 1]`` (per token) or ``[M, K / g]`` (per token group of ``g``, dividing ``K``). Dynamic scales
are ``amax / largest value``; a static scale comes from the checkpoint. fp8 values saturate
at the format's largest finite value, int8 values are rounded and clamped to [-128, 127].
"""

from __future__ import annotations

import torch

from hwplug.dtypes import torch_dtype
from hwplug.errors import UnsupportedError
from hwplug.quantization import ScaleDescriptor

#: Smallest scale used, so an all-zero row quantizes to zeros instead of NaN.
MIN_SCALE = 1e-12


def largest(dtype: torch.dtype) -> float:
    """The largest finite value of a quantized ``dtype``."""
    return float(torch.iinfo(dtype).max if not dtype.is_floating_point
                 else torch.finfo(dtype).max)


def quantize(x: torch.Tensor, descriptor: ScaleDescriptor,
             static_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` quantized to ``descriptor.dtype``; returns ``(values, scale)``."""
    dtype = torch_dtype(descriptor.dtype)
    top = largest(dtype)
    x32 = x.float()
    if not descriptor.dynamic:
        if static_scale is None:
            raise UnsupportedError(f"{descriptor} needs a static scale from the checkpoint")
        scale = static_scale.float()
        return _cast(x32 / scale, dtype, top), scale
    if descriptor.granularity == "tensor":
        scale = (x32.abs().amax() / top).clamp(min=MIN_SCALE)
        return _cast(x32 / scale, dtype, top), scale
    if descriptor.granularity == "token":
        scale = (x32.abs().amax(dim=-1, keepdim=True) / top).clamp(min=MIN_SCALE)
        return _cast(x32 / scale, dtype, top), scale
    if descriptor.granularity == "group":
        group = descriptor.group_shape[-1]
        rows, width = x32.shape
        if width % group:
            raise UnsupportedError(f"{width} inputs do not split into groups of {group}")
        groups = x32.view(rows, width // group, group)
        scale = (groups.abs().amax(dim=-1) / top).clamp(min=MIN_SCALE)  # [M, K / g]
        return _cast((groups / scale[..., None]).view(rows, width), dtype, top), scale
    raise UnsupportedError(f"activations cannot be quantized per {descriptor.granularity}; "
                           "supported: tensor, token, group")


def _cast(values: torch.Tensor, dtype: torch.dtype, top: float) -> torch.Tensor:
    if not dtype.is_floating_point:
        values = values.round()
    return values.clamp(-top - (0 if dtype.is_floating_point else 1), top).to(dtype)
