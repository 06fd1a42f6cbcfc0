"""Device functions shared by the kernels, built from core ``triton.language`` ops only
(libdevice names and ``tl.math`` contents differ across Triton 3.x releases), and what
the interpreter needs of them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def interpreter_widens(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether dots of ``dtype`` operands must be widened to fp32 on ``device``: bf16 on
    CPU, where Triton's interpreter multiplies the raw bits of bf16 operands."""
    return dtype == torch.bfloat16 and device.type == "cpu"


@triton.jit
def tanh(x):
    """``tanh(x)`` in fp32 as ``sign(x) * (1 - e) / (1 + e)``, ``e = exp(-2|x|)``: no
    overflow for any finite ``x``."""
    e = tl.exp(-2.0 * tl.abs(x))
    magnitude = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -magnitude, magnitude)


@triton.jit
def round_to_fp8_grid(x, MANTISSA: tl.constexpr, STEP: tl.constexpr,
                      SIGNED_ZERO: tl.constexpr):
    """fp32 ``x`` rounded to nearest-even onto the values of an fp8 format with
    ``MANTISSA`` mantissa bits whose subnormals are ``STEP`` apart, still in fp32 (``x``
    must be clamped to the format's range first). A cast of the result to the format is
    exact, so it does not depend on how the backend rounds: Triton's interpreter (3.x)
    rounds fp32 -> fp8 without carrying into the exponent (31.9 -> 16 in e4m3). Values
    that round to zero keep ``x``'s sign where the format has a negative zero
    (``SIGNED_ZERO``: OCP's formats, not the fnuz ones, whose 0x80 is NaN), as torch's
    casts do."""
    SHIFT: tl.constexpr = 23 - MANTISSA
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + ((1 << (SHIFT - 1)) - 1) + ((bits >> SHIFT) & 1)) & -(1 << SHIFT)
    magic = STEP * 12582912.0  # 1.5 * 2**23 * STEP: adding it rounds to a multiple of STEP
    magnitude = ((tl.abs(x) + magic) - magic).to(tl.int32, bitcast=True)
    subnormal = magnitude | (bits & -(1 << 31))
    if not SIGNED_ZERO:
        subnormal = tl.where(magnitude == 0, 0, subnormal)
    return tl.where(tl.abs(x) < STEP * (1 << MANTISSA), subnormal,
                    rounded).to(tl.float32, bitcast=True)


@triton.jit
def chunked(dims, CHUNK: tl.constexpr, chunk_stride):
    """Element offsets of head dimensions ``dims`` within one cache entry whose head
    dimension is stored in chunks of ``CHUNK`` elements, ``chunk_stride`` apart (see
    :mod:`hwplug_triton.kernels.layouts`)."""
    return (dims // CHUNK) * chunk_stride + dims % CHUNK


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """``(tile_m, tile_n)`` of program ``pid`` over an ``M x N`` output: programs walk down
    ``GROUP_M`` row tiles before moving to the next column tile, so consecutive programs
    share weight tiles in L2 (Triton's matmul tutorial order)."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows, (pid % per_group) // rows
