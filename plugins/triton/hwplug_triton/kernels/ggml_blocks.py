"""GGUF blocks dequantized in registers: the tile function the ``ggml_*`` kernels share.

:func:`dequantize_tile` returns the fp32 weight values at rows ``n`` and columns ``k`` of
a matrix stored as raw GGUF rows (``uint8 [N, row_bytes]``, each row the tensor's blocks
as the file holds them), reading only the bytes those values need: each value's quant
bits and its block's scales. The layouts are ggml's (``ggml-common.h``), documented in
:mod:`hwplug.kernel_registry.reference.ggml`; each type computes in the reference's
order, so values equal the reference's up to fp32 rounding of fused multiply-adds.

Served types (``gguf.GGMLQuantizationType`` values): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks
of 32) and Q4_K, Q5_K, Q6_K (super-blocks of 256). fp16 scales are read through a
``float16`` pointer, so rows must start at even byte offsets (every block size is even).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug.kernel_registry.reference.ggml import type_name

Q = GGMLQuantizationType
#: The GGUF types :func:`dequantize_tile` serves.
SERVED_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K)
SERVED_NAMES = ", ".join(type_name(t) for t in SERVED_TYPES)


def weight_problem(qweight: torch.Tensor, ggml_type: int, values: int | None) -> str | None:
    """Why the kernels cannot read ``qweight`` as rows of ``values`` values (None: as many
    as its rows hold) of ``ggml_type``, or None."""
    if ggml_type not in SERVED_TYPES:
        return f"GGUF type {type_name(ggml_type)} not served (serves {SERVED_NAMES})"
    if qweight.dtype != torch.uint8 or qweight.dim() != 2 or qweight.stride(1) != 1:
        return (f"needs qweight as uint8 [N, row_bytes] with unit column stride, got "
                f"{qweight.dtype} {list(qweight.shape)} strides {list(qweight.stride())}")
    if qweight.data_ptr() % 2 or qweight.stride(0) % 2:
        return "qweight rows must start at even byte addresses (fp16 scales are read in place)"
    block, size = GGML_QUANT_SIZES[Q(ggml_type)]
    if qweight.shape[1] % size or values not in (None, row_values(qweight, ggml_type)):
        return (f"rows of {qweight.shape[1]} bytes are not {values or 'whole'} "
                f"{type_name(ggml_type)} values ({size}-byte blocks of {block})")
    return None


def row_values(qweight: torch.Tensor, ggml_type: int) -> int:
    """How many values each row of ``qweight`` holds (its type served, rows whole)."""
    block, size = GGML_QUANT_SIZES[Q(ggml_type)]
    return qweight.shape[1] // size * block


@triton.jit
def _byte(ptr, offsets, mask):
    """The bytes at ``offsets`` as int32 (0 where masked)."""
    return tl.load(ptr + offsets, mask=mask, other=0).to(tl.int32)


@triton.jit
def _int8(ptr, offsets, mask):
    """The signed bytes at ``offsets`` as fp32 (0 where masked)."""
    return tl.load(ptr + offsets, mask=mask, other=0).to(tl.int8, bitcast=True).to(tl.float32)


@triton.jit
def _half(ptr, offsets, mask):
    """The fp16 fields at (even) byte ``offsets`` as fp32 (0 where masked)."""
    return tl.load((ptr + offsets).to(tl.pointer_type(tl.float16)), mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _legacy(w_ptr, row, k, mask, TYPE_SIZE: tl.constexpr, QS: tl.constexpr,
            QH: tl.constexpr, HAS_MIN: tl.constexpr, OFFSET: tl.constexpr):
    """Q4_0 / Q4_1 / Q5_0 / Q5_1: fp16 d (and m) at 0 (2), the fifth bits (a 32-bit field
    at ``QH``; 0: none), 16 bytes of nibbles at ``QS`` (value j < 16: low nibble of byte j;
    j >= 16: high nibble of byte j - 16). ``d q + m``, or ``d (q - OFFSET)``."""
    base = row + (k // 32) * TYPE_SIZE
    j = k % 32
    q = (_byte(w_ptr, base + QS + j % 16, mask) >> ((j // 16) * 4)) & 15
    if QH:  # bit j of the field is value j's fifth bit
        q = q | (((_byte(w_ptr, base + QH + j // 8, mask) >> (j % 8)) & 1) << 4)
    d = _half(w_ptr, base, mask)
    if HAS_MIN:
        values = d * q.to(tl.float32) + _half(w_ptr, base + 2, mask)
    else:
        values = d * (q - OFFSET).to(tl.float32)
    return values


@triton.jit
def _q8_0(w_ptr, row, k, mask):
    """fp16 d, then 32 int8 q: ``d q``."""
    base = row + (k // 32) * 34
    return _int8(w_ptr, base + 2 + k % 32, mask) * _half(w_ptr, base, mask)


@triton.jit
def _q4_k_q5_k(w_ptr, row, k, mask, FIFTH_BIT: tl.constexpr):
    """Q4_K (144 bytes) / Q5_K (176): fp16 d, dmin; 12 bytes of eight 6-bit (scale, min)
    pairs at 4; Q5_K's fifth bits at 16 (bit s of byte l: value l of sub-block s); nibbles
    at 16 (48): sub-block s, value l is nibble ``s % 2`` of byte ``32 (s // 2) + l``.
    ``(d scale_s) q - (dmin min_s)``."""
    TYPE_SIZE: tl.constexpr = 176 if FIFTH_BIT else 144
    QS: tl.constexpr = 48 if FIFTH_BIT else 16
    base = row + (k // 256) * TYPE_SIZE
    s = (k % 256) // 32
    lane = k % 32
    q = (_byte(w_ptr, base + QS + (s // 2) * 32 + lane, mask) >> ((s % 2) * 4)) & 15
    if FIFTH_BIT:
        q = q | (((_byte(w_ptr, base + 16 + lane, mask) >> s) & 1) << 4)
    # packed byte i at base + 4 + i; sub-blocks 0-3 keep 6 bits in bytes s and s + 4,
    # 4-7 four bits in byte s + 4 and their top two bits in bytes s - 4 and s
    low = s < 4
    this = _byte(w_ptr, base + 4 + s, mask)
    next4 = _byte(w_ptr, base + 8 + s, mask)
    before4 = _byte(w_ptr, base + 4 + tl.where(low, s, s - 4), mask)
    scale = tl.where(low, this & 63, (next4 & 15) | ((before4 >> 6) << 4))
    minimum = tl.where(low, next4 & 63, (next4 >> 4) | ((this >> 6) << 4))
    d = _half(w_ptr, base, mask) * scale.to(tl.float32)
    dm = _half(w_ptr, base + 2, mask) * minimum.to(tl.float32)
    return d * q.to(tl.float32) - dm


@triton.jit
def _q6_k(w_ptr, row, k, mask):
    """Q6_K (210 bytes): 128 bytes of low nibbles, 64 of 2-bit high pairs, 16 int8 scales
    (one per 16 values), fp16 d at 208. In each half of 128 values, value r's low bits are
    nibble ``r // 64`` of byte ``r % 64``, its high bits pair ``r // 32`` of byte
    ``r % 32``. ``(d scale) (q - 32)``."""
    base = row + (k // 256) * 210
    j = k % 256
    half = j // 128
    r = j % 128
    low = (_byte(w_ptr, base + half * 64 + r % 64, mask) >> ((r // 64) * 4)) & 15
    high = (_byte(w_ptr, base + 128 + half * 32 + r % 32, mask) >> ((r // 32) * 2)) & 3
    q = (low | (high << 4)) - 32
    d = _half(w_ptr, base + 208, mask) * _int8(w_ptr, base + 192 + j // 16, mask)
    return d * q.to(tl.float32)


@triton.jit
def dequantize_tile(w_ptr, row, k, mask, GGML_TYPE: tl.constexpr):
    """fp32 values of the GGUF matrix at ``w_ptr``: ``row`` is each value's row start in
    bytes (int64), ``k`` its column, broadcast together with ``mask`` (0 where masked).
    ``GGML_TYPE`` is one of :data:`SERVED_TYPES`."""
    if GGML_TYPE == 2:  # Q4_0
        values = _legacy(w_ptr, row, k, mask, 18, 2, 0, False, 8)
    elif GGML_TYPE == 3:  # Q4_1
        values = _legacy(w_ptr, row, k, mask, 20, 4, 0, True, 0)
    elif GGML_TYPE == 6:  # Q5_0
        values = _legacy(w_ptr, row, k, mask, 22, 6, 2, False, 16)
    elif GGML_TYPE == 7:  # Q5_1
        values = _legacy(w_ptr, row, k, mask, 24, 8, 4, True, 0)
    elif GGML_TYPE == 8:  # Q8_0
        values = _q8_0(w_ptr, row, k, mask)
    elif GGML_TYPE == 12:  # Q4_K
        values = _q4_k_q5_k(w_ptr, row, k, mask, False)
    elif GGML_TYPE == 13:  # Q5_K
        values = _q4_k_q5_k(w_ptr, row, k, mask, True)
    else:  # Q6_K
        values = _q6_k(w_ptr, row, k, mask)
    return values
