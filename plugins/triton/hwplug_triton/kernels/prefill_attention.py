"""Paged prefill / chunked-prefill attention over a varlen batch (flash-attention style).

One program serves ``BLOCK_Q`` consecutive queries of one sequence and one KV head;
its ``BLOCK_M = BLOCK_Q * G`` rows are those queries times the ``G = Hq / Hkv`` query
heads of the KV head (GQA: each key tile is read once per group). The grid is
``T // BLOCK_Q + B`` programs wide: sequence ``i``'s query blocks start at
``query_start_loc[i] // BLOCK_Q + i``, so a program finds its sequence by binary search
and the launch needs no host synchronisation; programs past a sequence's queries exit.
Keys are walked in tiles over the block table, only as far as the causal limit of the
program's last query and from the sliding-window start of its first one. The cache is
read through a :class:`~hwplug_triton.kernels.layouts.CacheView` (any layout).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import attention_tiles as tiles
from hwplug_triton.kernels.attention_tiles import attend_key_range, kv_head_scales
from hwplug_triton.kernels.functions import chunked
from hwplug_triton.kernels.layouts import CacheView
from hwplug_triton.tuning import launch_config

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams


def prefill_attention(query: torch.Tensor, view: CacheView, metadata: AttentionMetadata,
                      params: PagedAttentionParams,
                      scales: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``paged_attention`` for any varlen batch (prefill, chunked prefill and decode rows);
    ``scales`` are a quantized cache's ``[Hkv]`` k/v scales (from ``params``)."""
    block_tables, seq_lens = metadata.block_tables, metadata.seq_lens
    query_start_loc = metadata.query_start_loc
    sliding_window, soft_cap = params.sliding_window, params.soft_cap
    num_tokens, num_heads, head_size = query.shape
    num_seqs, num_kv_heads = seq_lens.shape[0], view.num_kv_heads
    group = num_heads // num_kv_heads
    config = launch_config("paged_attention_prefill", query.device, head_size)
    block_m = max(config["block_m"], triton.next_power_of_2(group))
    block_q = block_m // group
    out = query.new_empty(query.shape)
    _prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        query, *tiles.cache_arguments(view), *(scales or (out, out)), block_tables, seq_lens,
        query_start_loc, out, num_seqs, params.scale, soft_cap or 0.0, sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        **tiles.cache_constants(view), GROUP=group, HEAD_SIZE=head_size, BLOCK_Q=block_q,
        BLOCK_M=block_m, BLOCK_N=config["block_n"], BLOCK_D=tiles.padded_head_size(head_size),
        CAUSAL=params.causal, SLIDING=sliding_window is not None,
        SOFT_CAP=soft_cap is not None,
        SCALED=scales is not None, **tiles.dot_operands(query.dtype, query.device),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


@triton.jit
def _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """The sequence owning global query block ``q_block`` (the last ``i`` with
    ``query_start_loc[i] // BLOCK_Q + i <= q_block``)."""
    low: tl.int32 = 0
    high = num_seqs
    while low < high:
        mid = (low + high) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            low = mid + 1
        else:
            high = mid
    return low - 1


@triton.jit
def _prefill_kernel(query_ptr, k_ptr, k_block, k_slot, k_head, k_chunk_stride,
                    v_ptr, v_block, v_slot, v_head, v_chunk_stride, k_scale_ptr, v_scale_ptr,
                    block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr, num_seqs,
                    scale, soft_cap, sliding_window,
                    q_stride_t, q_stride_h, out_stride_t, out_stride_h, block_table_stride,
                    K_CHUNK: tl.constexpr, V_CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    CAUSAL: tl.constexpr, SLIDING: tl.constexpr, SOFT_CAP: tl.constexpr,
                    SCALED: tl.constexpr, WIDEN_DOT: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    first_query = (q_block - q_start // BLOCK_Q - seq) * BLOCK_Q
    if first_query >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_start = seq_len - q_len  # position of the sequence's first query

    rows = tl.arange(0, BLOCK_M)
    queries = first_query + rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    row_mask = (rows < BLOCK_Q * GROUP) & (queries < q_len)
    dims = tl.arange(0, BLOCK_D)
    mask = row_mask[:, None] & (dims[None, :] < HEAD_SIZE)
    tokens = (q_start + queries).to(tl.int64)
    q = tl.load(query_ptr + tokens[:, None] * q_stride_t + heads[:, None] * q_stride_h
                + dims[None, :], mask=mask, other=0.0)
    if WIDEN_DOT:
        q = q.to(tl.float32)

    key_end = seq_len
    if CAUSAL:
        key_end = context_start + tl.minimum(q_len, first_query + BLOCK_Q)
    key_start = 0
    if SLIDING:
        key_start = tl.maximum(0, context_start + first_query - sliding_window + 1)
    k_scale, v_scale = kv_head_scales(k_scale_ptr, v_scale_ptr, kv_head, SCALED)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    head = kv_head.to(tl.int64)
    acc, row_max, row_sum = attend_key_range(
        acc, row_max, row_sum, q, context_start + queries, key_start, key_end,
        k_ptr + head * k_head, k_block, k_slot, chunked(dims, K_CHUNK, k_chunk_stride),
        v_ptr + head * v_head, v_block, v_slot, chunked(dims, V_CHUNK, v_chunk_stride),
        block_tables_ptr + seq.to(tl.int64) * block_table_stride, scale * k_scale, soft_cap,
        sliding_window, HEAD_SIZE, BLOCK_SIZE, BLOCK_N, BLOCK_D, CAUSAL, SLIDING, SOFT_CAP,
        DOT_PRECISION)
    out = acc * v_scale / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
    tl.store(out_ptr + tokens[:, None] * out_stride_t + heads[:, None] * out_stride_h
             + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)
