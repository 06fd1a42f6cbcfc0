"""``ggml_embedding``: the rows of a GGUF table that ``ids`` name, dequantized (only those).

Contract (the ``ggml_embedding`` op, :mod:`hwplug.kernel_registry.ops_ggml`): ``ids [T]``
int64 / int32, ``qweight uint8 [V, row_bytes]`` of ``ggml_type``; returns ``[T, K]``
fp32. An id outside ``[0, V)`` raises :class:`~hwplug.errors.UnsupportedError` (checked
on the host before the launch, as the reference does). Each program gathers ``block_t``
rows and dequantizes ``block_k`` of their columns in registers
(:func:`~hwplug_triton.kernels.ggml_blocks.dequantize_tile`); tiles come from the
``ggml_embedding`` tuning table, bucketed by row width K.

supports: the GGUF types :mod:`.ggml_blocks` serves; see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug.kernel_registry.reference.ggml import check_ids
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.ggml_blocks import dequantize_tile, row_values, weight_problem
from hwplug_triton.tuning import launch_config


def supported(ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int) -> str | None:
    """Why this kernel cannot serve the call, or None (ids are checked by the call)."""
    return weight_problem(qweight, ggml_type, None)


@checked(supported)
def ggml_embedding(ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The ``ggml_embedding`` op (see the module docstring)."""
    check_ids(ids, qweight.shape[0])
    width = row_values(qweight, ggml_type)
    out = torch.empty((ids.shape[0], width), dtype=torch.float32, device=qweight.device)
    if out.numel():
        config = launch_config("ggml_embedding", qweight.device, width)
        block_t = min(config["block_t"], triton.next_power_of_2(ids.shape[0]))
        block_k = min(config["block_k"], triton.next_power_of_2(width))
        grid = (triton.cdiv(ids.shape[0], block_t), triton.cdiv(width, block_k))
        _embedding_kernel[grid](ids, qweight, out, ids.shape[0], width, qweight.stride(0),
                                GGML_TYPE=int(ggml_type), BLOCK_T=block_t, BLOCK_K=block_k,
                                num_warps=config["num_warps"])
    return out


@triton.jit
def _embedding_kernel(ids_ptr, w_ptr, out_ptr, T, K, row_stride, GGML_TYPE: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rows = tl.load(ids_ptr + tokens, mask=tokens < T, other=0).to(tl.int64)
    mask = (cols[:, None] < K) & (tokens[None, :] < T)
    values = dequantize_tile(w_ptr, rows[None, :] * row_stride, cols[:, None], mask,
                             GGML_TYPE)  # [BLOCK_K, BLOCK_T]
    tl.store(out_ptr + tokens.to(tl.int64)[None, :] * K + cols[:, None], values, mask=mask)
