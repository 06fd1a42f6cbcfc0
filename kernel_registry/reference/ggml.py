"""GGUF (ggml) quantized weights in pure torch: dequantization and the ``ggml_*`` references.

A GGUF tensor of ``N`` rows of ``K`` values is stored as ``uint8 [N, row_bytes]``: each row
the ``K / block`` blocks of its type exactly as the file holds them (what
``gguf.GGUFReader`` returns as a tensor's ``data``). Types are ``gguf.GGMLQuantizationType``
values; the block layouts are those of ggml (``ggml-common.h``), and each dequantizer
computes in the order ``gguf.quants`` does, so the results are equal bit for bit:

- Q4_0: fp16 d, 16 bytes of 4-bit q (low nibbles are values 0-15, high ones 16-31): d (q - 8)
- Q4_1: fp16 d, fp16 m, 4-bit q: d q + m
- Q5_0 / Q5_1: as Q4_0 / Q4_1 with a fifth bit per value (a 32-bit field): d (q - 16), d q + m
- Q8_0: fp16 d, 32 int8 q: d q
- Q4_K / Q5_K: super-blocks of 256: fp16 d and dmin, eight 6-bit (scale, min) pairs packed in
  12 bytes, 4-bit q (Q5_K: plus a fifth bit): (d scale_j) q - (dmin min_j) per 32 values
- Q6_K: 6-bit q (4 low bits, 2 high bits), 16 int8 scales, fp16 d: (d scale_j) (q - 32) per 16
- Q2_K: super-blocks of 256: 16 bytes of (4-bit scale, 4-bit min), 2-bit q, fp16 d and dmin:
  (d scale_j) q - (dmin min_j) per 16 values
- Q3_K: super-blocks of 256: a third bit per value (hmask), 2-bit q, sixteen 6-bit scales
  packed in 12 bytes, fp16 d: (d (scale_j - 32)) (q - 4) per 16, q's third bit included
- IQ4_NL: fp16 d, 16 bytes of 4-bit indices into 16 fixed values (:data:`IQ4_VALUES`, -127 to
  113; low nibbles are values 0-15): d value
- IQ4_XS: super-blocks of 256: fp16 d, eight 6-bit scales (high bits in 16 bits, low nibbles
  in 4 bytes), IQ4_NL's indices: (d (scale_j - 32)) value per 32
- F32, F16, BF16: the values themselves
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug.errors import UnsupportedError

Q = GGMLQuantizationType

#: Byte offsets of each block's fp16 scales (d, then m or dmin) by quantized GGUF type.
SCALE_FIELDS = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,),
                Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82),
                Q.Q3_K: (108,), Q.IQ4_NL: (0,), Q.IQ4_XS: (0,)}


def nonfinite_scales(rows: Any, ggml_type: int) -> int:
    """How many of the fp16 block scales (:data:`SCALE_FIELDS`) in ``rows`` (uint8 GGUF rows
    of ``ggml_type``, a tensor or an array, the last dimension a whole number of blocks)
    are NaN or infinite; 0 for a type without them. One such scale turns its block's
    values, and every output they reach, into NaN."""
    fields = SCALE_FIELDS.get(ggml_type, ())
    if not fields:
        return 0
    blocks = np.asarray(rows).reshape(-1, GGML_QUANT_SIZES[Q(ggml_type)][1])
    return sum(int((~np.isfinite(np.ascontiguousarray(blocks[:, start:start + 2])
                                 .view(np.float16))).sum()) for start in fields)


def _half(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte ``start`` of each block, as float32 ``[n, 1]``."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``[n, b]`` bytes -> ``[n, 2b]``: every byte's low nibble, then every high nibble."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=-1)


def _bits(field: torch.Tensor, width: int = 1) -> torch.Tensor:
    """``[..., b]`` bytes -> ``[..., 8 // width, b]``: group ``j`` holds bits ``j * width``
    to ``(j + 1) * width - 1`` of each byte."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=field.device).view(-1, 1)
    return (field.unsqueeze(-2) >> shifts) & ((1 << width) - 1)


def _legacy(blocks: torch.Tensor, with_min: bool, fifth_bit: bool) -> torch.Tensor:
    """Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 values."""
    q = _nibbles(blocks[:, -16:])
    if fifth_bit:
        start = 4 if with_min else 2
        q = q | (_bits(blocks[:, start:start + 4]).transpose(1, 2).reshape(-1, 32) << 4)
    d = _half(blocks, 0)
    if with_min:
        return d * q.float() + _half(blocks, 2)
    return d * (q.to(torch.int8) - (16 if fifth_bit else 8)).float()


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _half(blocks, 0)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: the eight 6-bit scales and mins of each super-block, ``[n, 8]`` each."""
    d, m, m_d = packed.view(-1, 3, 4).unbind(1)
    scales = torch.cat((d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)), dim=-1)
    mins = torch.cat((m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)), dim=-1)
    return scales, mins


def _q4_k_q5_k(blocks: torch.Tensor, fifth_bit: bool) -> torch.Tensor:
    n = blocks.shape[0]
    scales, mins = _k_scales(blocks[:, 4:16])
    qs = blocks[:, 48:] if fifth_bit else blocks[:, 16:]
    # value l of sub-block 2i (2i + 1): the low (high) nibble of qs[32 i + l]
    q = _bits(qs.reshape(n, 4, 32), 4).reshape(n, 8, 32)
    if fifth_bit:  # bit j of qh[l] is the fifth bit of value l of sub-block j
        q = q | (_bits(blocks[:, 16:48]) << 4)
    d = (_half(blocks, 0) * scales.float()).unsqueeze(-1)
    dm = (_half(blocks, 2) * mins.float()).unsqueeze(-1)
    return (d * q.float() - dm).reshape(n, 256)


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales = blocks[:, :16]
    # value l of 16-value group 2j (2j + 1), j = 4 half + s: bits 2s of qs[32 half + l] (+ 16)
    q = _bits(blocks[:, 16:80].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    dl = (_half(blocks, 80) * (scales & 0x0F).float()).unsqueeze(-1)
    ml = (_half(blocks, 82) * (scales >> 4).float()).unsqueeze(-1)
    return (dl * q.float() - ml).reshape(n, 256)


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    packed = blocks[:, 96:108]
    low = torch.cat((packed[:, :8] & 0x0F, packed[:, :8] >> 4), dim=-1)
    high = _bits(packed[:, 8:12], 2).reshape(n, 16)  # scale k: bits 2 (k // 4) of byte k % 4
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    q = _bits(blocks[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 8, 32)
    third = _bits(blocks[:, :32])  # bit j of hmask[l]: value l of group j of 32
    values = (q.to(torch.int8) - ((third ^ 1) << 2).to(torch.int8)).float()
    dl = (_half(blocks, 108) * scales).unsqueeze(-1)
    return (dl * values.reshape(n, 16, 16)).reshape(n, 256)


#: IQ4_NL's and IQ4_XS's 16 values, indexed by their 4-bit quants.
IQ4_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89,
                           113], dtype=torch.float32)


def _iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    return _half(blocks, 0) * IQ4_VALUES.to(blocks.device)[_nibbles(blocks[:, 2:]).long()]


def _iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    high = blocks[:, 2:4].contiguous().view(torch.int16).int()  # 2 bits per scale
    shifts = torch.arange(0, 16, 2, dtype=torch.int32, device=blocks.device)
    low = _bits(blocks[:, 4:8], 4).transpose(1, 2).reshape(n, 8)  # scale j: nibble j % 2 of j // 2
    scales = ((low.int() | (((high >> shifts) & 3) << 4)) - 32).float()
    values = IQ4_VALUES.to(blocks.device)[_nibbles(blocks[:, 8:].reshape(n, 8, 16)).long()]
    return ((_half(blocks, 0) * scales).unsqueeze(-1) * values).reshape(n, 256)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    # each half of 128 values: 64 bytes of low nibbles then high nibbles, 32 bytes of 2-bit pairs
    low = _bits(blocks[:, :128].reshape(n, 2, 64), 4).reshape(n, 8, 32)
    high = _bits(blocks[:, 128:192].reshape(n, 2, 32), 2).reshape(n, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    d = _half(blocks, 208) * blocks[:, 192:208].contiguous().view(torch.int8).float()
    return (d.unsqueeze(-1) * q.reshape(n, 16, 16).float()).reshape(n, 256)


#: type -> its blocks ``[n, type_size]`` uint8 -> values ``[n, block_size]`` float32.
DEQUANTIZERS = {
    Q.Q4_0: lambda b: _legacy(b, with_min=False, fifth_bit=False),
    Q.Q4_1: lambda b: _legacy(b, with_min=True, fifth_bit=False),
    Q.Q5_0: lambda b: _legacy(b, with_min=False, fifth_bit=True),
    Q.Q5_1: lambda b: _legacy(b, with_min=True, fifth_bit=True),
    Q.Q8_0: _q8_0,
    Q.Q4_K: lambda b: _q4_k_q5_k(b, fifth_bit=False),
    Q.Q5_K: lambda b: _q4_k_q5_k(b, fifth_bit=True),
    Q.Q6_K: _q6_k,
    Q.Q2_K: _q2_k,
    Q.Q3_K: _q3_k,
    Q.IQ4_NL: _iq4_nl,
    Q.IQ4_XS: _iq4_xs,
    Q.F32: lambda b: b.view(torch.float32),
    Q.F16: lambda b: b.view(torch.float16).float(),
    Q.BF16: lambda b: b.view(torch.bfloat16).float(),
}
#: The quantized types (the rest of :data:`DEQUANTIZERS` are plain floats).
QUANTIZED_TYPES = tuple(t for t in DEQUANTIZERS if t not in (Q.F32, Q.F16, Q.BF16))


def type_name(ggml_type: int) -> str:
    """``"Q4_K"`` for 12; ``"type 99"`` for a value gguf does not know."""
    try:
        return Q(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def row_values(ggml_type: int, row_bytes: int) -> int:
    """How many values a row of ``row_bytes`` bytes of ``ggml_type`` holds.

    Raises :class:`UnsupportedError` for a type without a dequantizer (naming those with
    one) or a row that is not a whole number of blocks.
    """
    if ggml_type not in DEQUANTIZERS:
        raise UnsupportedError(f"GGUF type {type_name(ggml_type)} has no dequantizer; "
                               f"supported: {', '.join(Q(t).name for t in DEQUANTIZERS)}")
    block, size = GGML_QUANT_SIZES[Q(ggml_type)]
    if row_bytes % size:
        raise UnsupportedError(f"a {type_name(ggml_type)} row of {row_bytes} bytes is not a "
                               f"whole number of {size}-byte blocks")
    return row_bytes // size * block


def dequantize(qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """``uint8 [..., row_bytes]`` rows of ``ggml_type`` blocks -> ``float32 [..., K]``."""
    if qweight.dtype != torch.uint8:
        raise UnsupportedError(f"GGUF rows are uint8 bytes, got {qweight.dtype}")
    values = row_values(ggml_type, qweight.shape[-1])
    size = GGML_QUANT_SIZES[Q(ggml_type)][1]
    blocks = qweight.reshape(-1, size)
    if ggml_type not in QUANTIZED_TYPES:
        blocks = blocks.contiguous()
    return DEQUANTIZERS[Q(ggml_type)](blocks).reshape(*qweight.shape[:-1], values)


def ggml_linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """The ``ggml_linear`` op: ``F.linear`` in fp32 on the dequantized weight, in ``x.dtype``
    (copied into ``out`` when given)."""
    weight = dequantize(qweight, ggml_type)
    if weight.shape[-1] != x.shape[-1] or qweight.dim() != 2:
        raise UnsupportedError(f"x [..., {x.shape[-1]}] does not fit a weight of "
                               f"{list(weight.shape)} values ({type_name(ggml_type)})")
    result = F.linear(x.float(), weight.to(x.device), None if bias is None else bias.float())
    return result.to(x.dtype) if out is None else out.copy_(result)


def ggml_embedding(ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The ``ggml_embedding`` op: rows ``ids`` of the table, dequantized (only those)."""
    check_ids(ids, qweight.shape[0])
    return dequantize(qweight.index_select(0, ids.reshape(-1)), ggml_type)


def check_ids(ids: torch.Tensor, rows: int) -> None:
    """Raise :class:`UnsupportedError` unless ``ids`` are 1-D integers in ``[0, rows)``."""
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
        raise UnsupportedError(f"ids must be 1-D int64 or int32, got {ids.dtype} "
                               f"{list(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= rows):
        raise UnsupportedError(f"token ids must lie in [0, {rows}), got "
                               f"{int(ids.min())} .. {int(ids.max())}")
