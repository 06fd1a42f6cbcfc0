"""``scaled_mm`` for fp8 operands: one tiled GEMM for every scale granularity, block scales
(DeepSeek-V3 style) applied per K tile.

Contract (the ``scaled_mm`` op, :mod:`hwplug.kernel_registry.ops`):
``((a * scale_a) @ (b * scale_b) + bias).to(out_dtype)`` with ``a [M, K]`` and
``b [K, N]`` fp8 of one format (any strides: the fp8 method passes ``b = weight.t()``),
``scale_a`` fp32 scalar, ``[M, 1]`` or ``[M, K / g]`` (per token group), ``scale_b``
scalar, ``[1, N]`` or ``[K / bk, N / bn]`` (per block; any strides), ``bias [N]`` or None;
``out_dtype`` fp32 / bf16 / fp16.

Dots take the fp8 tiles as they are (fp8 tensor cores) and accumulate in fp32 (with
``max_num_imprecise_acc=0``: Triton's default on sm_90 keeps the fp8 MMA's reduced-precision
accumulator, which put 0.4% of outputs past the op's tolerance on an H100). Scales
constant along K (per tensor, token or channel) multiply the finished sum once; scales
that change along K (token groups, weight blocks) multiply each K tile's dot before it is
added to the fp32 accumulator, so a tile never straddles a scale block: ``BLOCK_K`` is
the largest power of two that divides both K group sizes, at most the table's. Tiles come
from the ``fp8_matmul`` tuning table, bucketed by M.

supports: a and b both float8_e4m3fn, float8_e5m2, float8_e4m3fnuz or float8_e5m2fnuz
(the formats a device's Triton can dot are the registration's gate: e4m3fn needs
capability 8.9 on NVIDIA; on AMD gfx942 computes in the fnuz formats natively and
emulates the OCP ones, gfx950 the reverse); K groups of at least 32 values; see
:func:`supported`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.kernels.functions import grouped_tile
from hwplug_triton.kernels.layouts import COMPUTE_DTYPES
from hwplug_triton.tuning import launch_config

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
              torch.float8_e5m2fnuz)
#: Smallest K tile of an fp8 dot (the K of NVIDIA's fp8 MMA instructions).
MIN_BLOCK_K = 32


def scale_layout(scale: torch.Tensor, shape: tuple[int, int]
                 ) -> tuple[tuple[int, int], tuple[int, int]] | str:
    """``(strides, block sizes)`` with which entry ``(i // block[0], j // block[1])`` of
    ``scale`` scales element ``(i, j)`` of an operand of ``shape``; a dimension of one
    entry has stride 0 and one block. A reason string when the entries do not split
    ``shape`` into equal blocks."""
    if scale.dim() == 0:
        return (0, 0), shape
    if scale.dim() != 2:
        return f"scales must be a scalar or 2-D, got shape {tuple(scale.shape)}"
    strides, blocks = [], []
    for entries, size, stride in zip(scale.shape, shape, scale.stride(), strict=True):
        if entries == 0 or size % entries:
            return f"{entries} scales do not split a dimension of {size} into equal blocks"
        strides.append(0 if entries == 1 else stride)
        blocks.append(size // entries)
    return (strides[0], strides[1]), (blocks[0], blocks[1])


def _k_group(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor,
             scale_b: torch.Tensor) -> int | str:
    """K values sharing one scale of each operand (K itself when neither changes along
    K), or why the scales cannot be read."""
    layouts = (scale_layout(scale_a, tuple(a.shape)), scale_layout(scale_b, tuple(b.shape)))
    for layout in layouts:
        if isinstance(layout, str):
            return layout
    return math.gcd(layouts[0][1][1], layouts[1][1][0])


def supported(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    if a.dtype not in FP8_DTYPES or b.dtype != a.dtype:
        return f"needs a and b in one fp8 format, got {a.dtype} and {b.dtype}"
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        return f"needs a [M, K] and b [K, N], got {list(a.shape)} and {list(b.shape)}"
    if out_dtype not in COMPUTE_DTYPES:
        return f"out_dtype {out_dtype} not in fp32, bf16, fp16"
    group = _k_group(a, scale_a, b, scale_b)
    if isinstance(group, str):
        return group
    if group < a.shape[1] and group & -group < MIN_BLOCK_K:
        return (f"K groups of {group} values: a K tile (a power of two dividing them) "
                f"would be below {MIN_BLOCK_K}")
    if bias is not None and tuple(bias.shape) != (b.shape[1],):
        return f"bias of shape {list(bias.shape)} is not [{b.shape[1]}]"
    return None


@checked(supported)
def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
              out_dtype: torch.dtype, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The ``scaled_mm`` op for fp8 operands (see the module docstring)."""
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if out.numel() == 0:
        return out
    (sa_strides, sa_blocks) = scale_layout(scale_a, (m, k))
    (sb_strides, sb_blocks) = scale_layout(scale_b, (k, n))
    group = math.gcd(sa_blocks[1], sb_blocks[0])
    config = launch_config("fp8_matmul", a.device, m)
    per_tile = group < k
    block_k = min(config["block_k"], group & -group) if per_tile else config["block_k"]
    block_m = max(16, min(config["block_m"], triton.next_power_of_2(m)))
    block_n = config["block_n"]
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _fp8_matmul_kernel[grid](
        a, b, scale_a.float(), scale_b.float(), a if bias is None else bias, out, m, n, k,
        *a.stride(), *b.stride(), *sa_strides, *sb_strides, sa_blocks[0], sa_blocks[1],
        sb_blocks[0], sb_blocks[1], HAS_BIAS=bias is not None, PER_TILE=per_tile,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["group_m"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


@triton.jit
def _fp8_matmul_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, out_ptr, M, N, K,
                       stride_am, stride_ak, stride_bk, stride_bn, stride_sam, stride_sak,
                       stride_sbk, stride_sbn, block_am, block_ak, block_bk, block_bn,
                       HAS_BIAS: tl.constexpr, PER_TILE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tile_m, tile_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    # each row's (column's) scales, at the K offset of the tile
    sa_ptrs = sa_ptr + (rm // block_am) * stride_sam
    sb_ptrs = sb_ptr + (rn // block_bn) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        in_k = k0 + rk < K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & in_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=in_k[:, None] & (rn[None, :] < N), other=0.0)
        if PER_TILE:
            sa = tl.load(sa_ptrs + (k0 // block_ak) * stride_sak, mask=rm < M, other=0.0)
            sb = tl.load(sb_ptrs + (k0 // block_bk) * stride_sbk, mask=rn < N, other=0.0)
            tile = tl.dot(a, b, input_precision="ieee", max_num_imprecise_acc=0)
            acc += tile * sa[:, None] * sb[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee", max_num_imprecise_acc=0)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if not PER_TILE:
        sa = tl.load(sa_ptrs, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptrs, mask=rn < N, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
