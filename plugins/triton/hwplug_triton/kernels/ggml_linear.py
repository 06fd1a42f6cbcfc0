"""``ggml_linear``: ``x @ W.T`` with W's GGUF blocks dequantized in registers, tile by tile.

Contract (the ``ggml_linear`` op, :mod:`hwplug.kernel_registry.ops_ggml`): ``x [..., K]``
fp32 / bf16 / fp16, ``qweight uint8 [N, row_bytes]`` (each row the GGUF blocks of one
output row, as the file stores them) of ``ggml_type``, ``bias [N]`` or None; returns
``[..., N]`` in ``x.dtype``, accumulated in fp32 (copied into ``out`` when given). No dequantized weight is ever stored:
each program dequantizes ``[BLOCK_K, BLOCK_N]`` tiles of W in registers
(:func:`~hwplug_triton.kernels.ggml_blocks.dequantize_tile`), casts them to x's dtype and
multiplies them with x's tiles by ``tl.dot`` (exact fp32 products for fp32 x; the
activations are not quantized).

One kernel serves decode and prefill; its tiles come from the ``ggml_matmul`` tuning table,
bucketed by activation rows M: up to 16 rows (decode) one 16-row tile, with the K range
split over ``split_k`` programs per output tile (their fp32 partial sums added after)
so that a few hundred programs stream the weight; more rows take larger GEMM tiles,
grouped for L2 reuse.

supports: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; x fp32 / bf16 / fp16; qweight
with a unit column stride and even row starts; see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.kernels.functions import grouped_tile, interpreter_widens
from hwplug_triton.kernels.ggml_blocks import dequantize_tile, weight_problem
from hwplug_triton.kernels.layouts import COMPUTE_DTYPES
from hwplug_triton.tuning import launch_config


def supported(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
              bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    if x.dtype not in COMPUTE_DTYPES:
        return f"x dtype {x.dtype} not in fp32, bf16, fp16"
    problem = weight_problem(qweight, ggml_type, x.shape[-1])
    if problem is None and bias is not None and tuple(bias.shape) != (qweight.shape[0],):
        return f"bias of shape {list(bias.shape)} is not [{qweight.shape[0]}]"
    return problem


@checked(supported)
def ggml_linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """The ``ggml_linear`` op (see the module docstring)."""
    result = _linear(x, qweight, ggml_type, bias)
    return result if out is None else out.copy_(result)


def _linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
            bias: torch.Tensor | None) -> torch.Tensor:
    k, n = x.shape[-1], qweight.shape[0]
    rows = x.reshape(-1, k)
    m = rows.shape[0]
    out = rows.new_empty((m, n))
    if out.numel() == 0:
        return out.view(*x.shape[:-1], n)
    config = launch_config("ggml_matmul", x.device, m)
    block_m = max(16, min(config["block_m"], triton.next_power_of_2(m)))
    block_n, block_k = config["block_n"], config["block_k"]
    k_tiles = triton.cdiv(k, block_k)
    per_split = max(1, triton.cdiv(k_tiles, config["split_k"]))
    split = max(1, triton.cdiv(k_tiles, per_split))  # no split left without a tile
    partials = out if split == 1 else rows.new_empty((split, m, n), dtype=torch.float32)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split)
    _ggml_matmul_kernel[grid](
        rows, qweight, rows if bias is None else bias, partials, m, n, k, rows.stride(0),
        rows.stride(1), qweight.stride(0), k_tiles, per_split, GGML_TYPE=int(ggml_type),
        HAS_BIAS=bias is not None and split == 1, WIDEN_DOT=interpreter_widens(x.dtype, x.device),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["group_m"],
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if split > 1:
        summed = partials.sum(0)
        if bias is not None:
            summed += bias.float()
        out = summed.to(x.dtype)
    return out.view(*x.shape[:-1], n)


@triton.jit
def _ggml_matmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K, stride_xm, stride_xk,
                        row_stride, k_tiles, per_split, GGML_TYPE: tl.constexpr,
                        HAS_BIAS: tl.constexpr, WIDEN_DOT: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr):
    """Output tile ``(program_id(0))`` over K tiles ``[split * per_split, ...)`` of split
    ``program_id(1)``; with one split the result (plus bias) in ``out_ptr``'s dtype, else
    fp32 partial sums in ``out_ptr[split]``."""
    tile_m, tile_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    split = tl.program_id(1)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row = rn.to(tl.int64)[None, :] * row_stride  # [1, BLOCK_N]: where each W row starts
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first = split * per_split
    for tile in range(first, tl.minimum(first + per_split, k_tiles)):
        kk = tile * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm.to(tl.int64)[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = dequantize_tile(w_ptr, row, kk[:, None], (kk[:, None] < K) & (rn[None, :] < N),
                            GGML_TYPE)  # [BLOCK_K, BLOCK_N] = W.T's tile
        if WIDEN_DOT:
            x = x.to(tl.float32)
        acc = tl.dot(x, w.to(x.dtype), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + split.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))
