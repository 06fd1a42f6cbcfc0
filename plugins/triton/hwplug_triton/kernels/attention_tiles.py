"""The inner loop both paged-attention kernels share: online softmax over key tiles.

Keys are read straight from the paged cache in any layout (see :mod:`.layouts`): key
``k`` of a sequence lives at block ``block_table[k // BLOCK_SIZE]``, slot
``k % BLOCK_SIZE``, so a tile of ``BLOCK_N`` keys may span several cache blocks and any
block size works. Scores are kept in log2 units (``exp2`` softmax); ``(acc, row_max,
row_sum)`` is the running state of ``BLOCK_M`` query rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels.functions import interpreter_widens, tanh
from hwplug_triton.kernels.layouts import CacheView


def padded_head_size(head_size: int) -> int:
    """``BLOCK_D``: the head size padded to a power of two of at least 16 (``tl.dot``'s
    smallest K)."""
    return max(16, triton.next_power_of_2(head_size))


def dot_operands(dtype: torch.dtype, device: torch.device) -> dict[str, object]:
    """``WIDEN_DOT`` and ``DOT_PRECISION`` of the kernels for queries of ``dtype``.

    Dots take the dtype of the loaded queries (keys, values and softmax weights are cast
    to it: exact for fp8 caches) and accumulate in fp32; fp32 dots use exact products (no
    TF32). On CPU, under the Triton interpreter, bf16 queries are widened to fp32
    (``WIDEN_DOT``): the interpreter multiplies the raw bits of bf16 operands.
    """
    widen = interpreter_widens(dtype, device)
    exact = widen or dtype == torch.float32
    return {"WIDEN_DOT": widen, "DOT_PRECISION": "ieee" if exact else "tf32"}


def cache_arguments(view: CacheView) -> tuple[object, ...]:
    """The runtime arguments with which the attention kernels read ``view``: each half's
    pointer and strides (the chunks go in :func:`cache_constants`)."""
    return (*view.keys.pointer_and_strides(), *view.values.pointer_and_strides())


def cache_constants(view: CacheView) -> dict[str, int]:
    """The compile-time constants with which the attention kernels read ``view``."""
    return {"K_CHUNK": view.keys.chunk, "V_CHUNK": view.values.chunk,
            "BLOCK_SIZE": view.block_size}


@triton.jit
def attend_key_range(acc, row_max, row_sum, q, q_pos, key_start, key_end,
                     k_ptr, k_block, k_slot, k_dims, v_ptr, v_block, v_slot, v_dims,
                     block_table_ptr, scale, soft_cap, sliding_window,
                     HEAD_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, SLIDING: tl.constexpr,
                     SOFT_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold keys ``[key_start, key_end)`` of one sequence into the state of the rows
    ``q [BLOCK_M, BLOCK_D]`` at positions ``q_pos [BLOCK_M]``; returns the new
    ``(acc [BLOCK_M, BLOCK_D] fp32, row_max [BLOCK_M], row_sum [BLOCK_M])``.

    ``k_ptr`` / ``v_ptr`` point at the KV head's entries, ``k_dims`` / ``v_dims`` are the
    offsets of the head dimensions within an entry (``functions.chunked``). Dots run in
    ``q``'s dtype; ``scale`` includes a quantized cache's key scale. A row that has seen no
    visible key keeps ``row_max = -inf`` and ``row_sum = 0``.
    """
    dim_mask = tl.arange(0, BLOCK_D) < HEAD_SIZE
    for tile_start in range(key_start, key_end, BLOCK_N):
        keys = tile_start + tl.arange(0, BLOCK_N)
        in_range = keys < key_end
        blocks = tl.load(block_table_ptr + keys // BLOCK_SIZE, mask=in_range, other=0)
        blocks = blocks.to(tl.int64)
        offsets = keys % BLOCK_SIZE
        k = tl.load(k_ptr + (blocks * k_block + offsets * k_slot)[None, :] + k_dims[:, None],
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
        v = tl.load(v_ptr + (blocks * v_block + offsets * v_slot)[:, None] + v_dims[None, :],
                    mask=in_range[:, None] & dim_mask[None, :], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(weights.to(q.dtype), v.to(q.dtype),
                                              input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def kv_head_scales(k_scale_ptr, v_scale_ptr, kv_head, SCALED: tl.constexpr):
    """``(k_scale, v_scale)`` of one KV head of a quantized cache, else ``(1.0, 1.0)``."""
    k_scale = 1.0
    v_scale = 1.0
    if SCALED:
        k_scale = tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
    return k_scale, v_scale
