"""Group-wise symmetric int4 weights: their layout, and the reference ``int4_linear``.

``qweight`` is ``uint8 [N, K / 2]``, row-major, two 4-bit values per byte: the weight
``W[n, k]``'s code sits in byte ``qweight[n, k // 2]``, in the low nibble for even ``k``
and the high nibble for odd ``k``, stored with an offset of 8 (code ``c`` in 0..15 is the
value ``c - 8`` in -8..7). This is the layout ``torch.ops.aten._dyn_quant_pack_4bit_weight``
takes, and, read as bytes on a little-endian machine, the ``int32 [N, K / 8]``
``weight_packed`` tensor compressed-tensors' ``pack-quantized`` format stores (eight codes
per int32, the first in the lowest bits). ``scales`` is ``[N, K / g]``: one scale per
output row and group of ``g`` consecutive inputs (``g = K``: one per row), so
``W[n, k] = (code - 8) * scales[n, k // g]``. ``K`` is even and ``g`` divides it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hwplug.errors import UnsupportedError

__all__ = ["OFFSET", "dequantize_int4", "group_size", "int4_linear", "pack_int4", "unpack_int4"]

#: The stored code of the value 0 (codes 0..15 are the values -8..7).
OFFSET = 8


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """``qweight uint8 [N, K / 2]`` -> its values, ``int8 [N, K]`` in -8..7."""
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise UnsupportedError(f"int4 weights are uint8 [N, K / 2], got {qweight.dtype} "
                               f"{list(qweight.shape)}")
    codes = torch.stack((qweight & 0xF, qweight >> 4), dim=-1).flatten(-2)
    return codes.to(torch.int8) - OFFSET


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """``values`` (integers in -8..7, ``[N, K]``, K even) -> ``qweight uint8 [N, K / 2]``;
    the inverse of :func:`unpack_int4`."""
    if values.shape[-1] % 2 or int(values.min()) < -OFFSET or int(values.max()) >= OFFSET:
        raise UnsupportedError("int4 packing needs an even number of columns of values in "
                               f"-8..7, got {list(values.shape)} in {int(values.min())}.."
                               f"{int(values.max())}")
    codes = (values.to(torch.int16) + OFFSET).to(torch.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def group_size(in_features: int, scales: torch.Tensor) -> int:
    """The group size ``g`` of ``scales [N, K / g]`` for ``in_features`` (``K``) inputs;
    :class:`UnsupportedError` when the scales do not split ``K`` into equal groups."""
    groups = scales.shape[-1] if scales.dim() == 2 else 0
    if not groups or in_features % groups:
        raise UnsupportedError(f"int4 scales {list(scales.shape)} do not split {in_features} "
                               "inputs into equal groups (expected [N, K / group_size])")
    return in_features // groups


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``W = (code - 8) * scale``, float32 ``[N, K]``."""
    values = unpack_int4(qweight)
    rows, width = values.shape
    if scales.shape[0] != rows:
        raise UnsupportedError(f"int4 scales {list(scales.shape)} do not match {rows} rows")
    group = group_size(width, scales)
    return (values.float().view(rows, -1, group) * scales.float()[..., None]).view(rows, width)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ dequantize_int4(qweight, scales).T + bias`` -> ``[..., N]``, computed
    in float32 (``F.linear``) and returned in ``x.dtype``."""
    weight = dequantize_int4(qweight, scales)
    if x.shape[-1] != weight.shape[1]:
        raise UnsupportedError(f"x has {x.shape[-1]} inputs, the int4 weight "
                               f"{weight.shape[1]}")
    return F.linear(x.float(), weight, None if bias is None else bias.float()).to(x.dtype)
