"""The inner loop both paged-attention kernels share: online softmax over key tiles.

Keys are read straight from the paged cache (layout NHD): key ``k`` of a sequence lives
at block ``block_table[k // BLOCK_SIZE]``, slot ``k % BLOCK_SIZE``, so a tile of
``BLOCK_N`` keys may span several cache blocks and any block size works. Scores are kept
in log2 units (``exp2`` softmax); ``(acc, row_max, row_sum)`` is the running state of
``BLOCK_M`` query rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_cuda.kernels.functions import tanh


def padded_head_size(head_size: int) -> int:
    """``BLOCK_D``: the head size padded to a power of two of at least 16 (``tl.dot``'s
    smallest K)."""
    return max(16, triton.next_power_of_2(head_size))


def dot_operands(dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """``WIDEN_DOT`` and ``DOT_PRECISION`` of the kernels for queries of ``dtype``.

    Dots take the dtype of the loaded queries (keys, values and softmax weights are cast
    to it) and accumulate in fp32; fp32 dots use exact products (no TF32). Off CUDA, under
    the Triton interpreter, bf16 queries are widened to fp32 (``WIDEN_DOT``): the
    interpreter multiplies the raw bits of bf16 operands.
    """
    widen = dtype == torch.bfloat16 and device.type != "cuda"
    exact = widen or dtype == torch.float32
    return {"WIDEN_DOT": widen, "DOT_PRECISION": "ieee" if exact else "tf32"}


@triton.jit
def attend_key_range(acc, row_max, row_sum, q, q_pos, key_start, key_end,
                     k_cache_ptr, v_cache_ptr, block_table_ptr, kv_head_offset,
                     stride_block, stride_slot, scale, soft_cap, sliding_window,
                     HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, SLIDING: tl.constexpr,
                     SOFT_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold keys ``[key_start, key_end)`` of one sequence into the state of the rows
    ``q [BLOCK_M, BLOCK_D]`` at positions ``q_pos [BLOCK_M]``; returns the new
    ``(acc [BLOCK_M, BLOCK_D] fp32, row_max [BLOCK_M], row_sum [BLOCK_M])``.

    Dots run in ``q``'s dtype; ``kv_head_offset`` is the KV head's element
    offset within a cache slot. A row that
    has seen no visible key keeps ``row_max = -inf`` and ``row_sum = 0``.
    """
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_SIZE
    for tile_start in range(key_start, key_end, BLOCK_N):
        keys = tile_start + tl.arange(0, BLOCK_N)
        in_range = keys < key_end
        blocks = tl.load(block_table_ptr + keys // BLOCK_SIZE, mask=in_range, other=0)
        slots = blocks.to(tl.int64) * stride_block + (keys % BLOCK_SIZE) * stride_slot \
            + kv_head_offset
        k = tl.load(k_cache_ptr + slots[None, :] + dims[:, None],
                    mask=in_range[None, :] & dim_mask[:, None], other=0.0)
        scores = tl.dot(q, k.to(q.dtype), input_precision=DOT_PRECISION) * scale
        if SOFT_CAP:
            scores = soft_cap * tanh(scores / soft_cap)
        scores = scores * 1.4426950408889634  # log2(e): softmax with exp2
        visible = in_range[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= q_pos[:, None])
        if SLIDING:
            visible = visible & (q_pos[:, None] - keys[None, :] < sliding_window)
        scores = tl.where(visible, scores, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        weights = tl.exp2(scores - safe_max[:, None])
        rescale = tl.exp2(row_max - safe_max)
        row_sum = row_sum * rescale + tl.sum(weights, axis=1)
        v = tl.load(v_cache_ptr + slots[:, None] + dims[None, :],
                    mask=in_range[:, None] & dim_mask[None, :], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(weights.to(q.dtype), v.to(q.dtype),
                                              input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum
