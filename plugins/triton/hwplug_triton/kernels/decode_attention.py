"""Paged decode attention (every query length 1): GQA-grouped, split-KV (flash-decoding).

One program serves one sequence, one KV head and one split of the context: it holds all
``G = Hq / Hkv`` query heads of that KV head as rows, so each key and value is read once
per group. With more than one split, each program writes an unnormalised partial
(accumulator, running max, running sum) and ``reduce_splits_kernel`` merges them (the
MLA decode kernel's splits too).
The number of splits is chosen so that ``batch * Hkv * splits`` fills the GPU
(``waves`` programs per compute unit), and no split is shorter than ``min_split_tokens``.
The cache is read through a :class:`~hwplug_triton.kernels.layouts.CacheView`, so one
kernel serves every layout; a quantized cache's scales fold into the score scale (keys)
and the accumulator (values).
"""

from __future__ import annotations

from functools import cache
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


def decode_attention(query: torch.Tensor, view: CacheView, metadata: AttentionMetadata,
                     params: PagedAttentionParams,
                     scales: tuple[torch.Tensor, torch.Tensor] | None,
                     split_size: int | None = None) -> torch.Tensor:
    """``paged_attention`` for a batch whose every query length is 1 (``query [B, Hq, D]``).

    ``metadata.max_seq_len`` sizes the grid; ``scales`` are a quantized cache's ``[Hkv]``
    k/v scales (from ``params``, as :func:`~hwplug_triton.kernels.layouts.head_scales`
    makes them). ``split_size`` (keys per split, rounded up to the key tile) overrides the
    tuned choice; ``split_size >= max_seq_len`` means no split. Causality needs no mask
    here: a decode query sees its whole context.
    """
    block_tables, seq_lens = metadata.block_tables, metadata.seq_lens
    query_start_loc, max_seq_len = metadata.query_start_loc, metadata.max_seq_len
    sliding_window, soft_cap = params.sliding_window, params.soft_cap
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = view.num_kv_heads
    group = num_heads // num_kv_heads
    config = launch_config("paged_attention_decode", query.device, max_seq_len)
    split_size, num_splits = split_plan(num_seqs * num_kv_heads, max_seq_len, config,
                                        query.device, split_size)
    out = query.new_empty(query.shape)
    partial_acc, partial_max, partial_sum = split_partials(out, num_seqs, num_heads,
                                                           num_splits, head_size)
    block_d = tiles.padded_head_size(head_size)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, *tiles.cache_arguments(view), *(scales or (out, out)), block_tables, seq_lens,
        query_start_loc, out, partial_acc, partial_max, partial_sum, num_heads, num_splits,
        split_size, params.scale, soft_cap or 0.0, sliding_window or 0,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        **tiles.cache_constants(view), GROUP=group, HEAD_SIZE=head_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=config["block_n"], BLOCK_D=block_d,
        SLIDING=sliding_window is not None, SOFT_CAP=soft_cap is not None,
        SCALED=scales is not None, SPLIT=num_splits > 1,
        **tiles.dot_operands(query.dtype, query.device),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if num_splits > 1:
        reduce_splits_kernel[(num_seqs, num_heads)](
            partial_acc, partial_max, partial_sum, seq_lens, query_start_loc, out,
            num_heads, num_splits, split_size, out.stride(0), out.stride(1),
            HEAD_SIZE=head_size, BLOCK_D=block_d,
            BLOCK_SPLITS=triton.next_power_of_2(num_splits))
    return out


def split_partials(out: torch.Tensor, rows: int, num_heads: int, num_splits: int, width: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fp32 partial accumulators ``[rows, heads, splits, width]``, maxima and sums
    ``[rows, heads, splits]`` a split kernel writes for ``reduce_splits_kernel``; ``out``
    three times (never read) when there is one split."""
    if num_splits == 1:
        return out, out, out
    acc = out.new_empty((rows, num_heads, num_splits, width), dtype=torch.float32)
    maxima = out.new_empty((rows, num_heads, num_splits), dtype=torch.float32)
    return acc, maxima, torch.empty_like(maxima)


def split_plan(programs: int, max_seq_len: int, config: dict, device: torch.device,
               split_size: int | None = None) -> tuple[int, int]:
    """``(split_size, num_splits)`` of a decode launch of ``programs`` (sequence, KV head)
    pairs over contexts of at most ``max_seq_len`` keys.

    Unless ``split_size`` is given, splits are added until there are ``waves`` programs
    per compute unit, keeping every split at least ``min_split_tokens`` long. The split
    size is rounded up to whole key tiles (``block_n``).
    """
    if split_size is None:
        wanted = triton.cdiv(config["waves"] * _compute_units(device.type, device.index),
                             programs)
        splits = max(1, min(wanted, max_seq_len // config["min_split_tokens"]))
        split_size = triton.cdiv(max_seq_len, splits)
    split_size = triton.cdiv(max(split_size, 1), config["block_n"]) * config["block_n"]
    return split_size, triton.cdiv(max_seq_len, split_size)


@cache
def _compute_units(device_type: str, index: int | None) -> int:
    """Streaming multiprocessors (CUDA), compute units (ROCm, torch's ``cuda`` there too) or
    Xe cores (XPU: ``gpu_subslice_count``) of the device; 1 on CPU (the interpreter) and
    where the device reports neither."""
    if device_type == "cpu":
        return 1
    module = getattr(torch, device_type)
    index = module.current_device() if index is None else index
    properties = module.get_device_properties(index)
    return (getattr(properties, "multi_processor_count", None)
            or getattr(properties, "gpu_subslice_count", None) or 1)


@triton.jit
def _decode_kernel(query_ptr, k_ptr, k_block, k_slot, k_head, k_chunk_stride,
                   v_ptr, v_block, v_slot, v_head, v_chunk_stride, k_scale_ptr, v_scale_ptr,
                   block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, out_ptr,
                   partial_acc_ptr, partial_max_ptr, partial_sum_ptr, num_heads, num_splits,
                   split_size, scale, soft_cap, sliding_window,
                   q_stride_t, q_stride_h, out_stride_t, out_stride_h, block_table_stride,
                   K_CHUNK: tl.constexpr, V_CHUNK: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   GROUP: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SLIDING: tl.constexpr,
                   SOFT_CAP: tl.constexpr, SCALED: tl.constexpr, SPLIT: tl.constexpr,
                   WIDEN_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    key_start = split * split_size
    if key_start >= seq_len:
        return
    key_end = tl.minimum(seq_len, key_start + split_size)
    if SLIDING:
        key_start = tl.maximum(key_start, seq_len - sliding_window)

    rows = tl.arange(0, BLOCK_G)
    heads = kv_head * GROUP + rows
    row_mask = rows < GROUP
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_SIZE
    token = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q = tl.load(query_ptr + token * q_stride_t + heads[:, None] * q_stride_h + dims[None, :],
                mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    if WIDEN_DOT:
        q = q.to(tl.float32)
    k_scale, v_scale = kv_head_scales(k_scale_ptr, v_scale_ptr, kv_head, SCALED)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    row_max = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
    q_pos = tl.full([BLOCK_G], 0, dtype=tl.int32) + seq_len - 1
    head = kv_head.to(tl.int64)
    acc, row_max, row_sum = attend_key_range(
        acc, row_max, row_sum, q, q_pos, key_start, key_end,
        k_ptr + head * k_head, k_block, k_slot, chunked(dims, K_CHUNK, k_chunk_stride),
        v_ptr + head * v_head, v_block, v_slot, chunked(dims, V_CHUNK, v_chunk_stride),
        block_tables_ptr + seq.to(tl.int64) * block_table_stride, scale * k_scale, soft_cap,
        sliding_window, HEAD_SIZE, BLOCK_SIZE, BLOCK_N, BLOCK_D, False, SLIDING, SOFT_CAP,
        DOT_PRECISION)
    acc = acc * v_scale

    if SPLIT:
        partial = (seq * num_heads + heads) * num_splits + split
        tl.store(partial_acc_ptr + partial[:, None] * HEAD_SIZE + dims[None, :], acc,
                 mask=row_mask[:, None] & dim_mask[None, :])
        tl.store(partial_max_ptr + partial, row_max, mask=row_mask)
        tl.store(partial_sum_ptr + partial, row_sum, mask=row_mask)
    else:
        out = acc / row_sum[:, None]
        tl.store(out_ptr + token * out_stride_t + heads[:, None] * out_stride_h + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & dim_mask[None, :])


@triton.jit
def reduce_splits_kernel(partial_acc_ptr, partial_max_ptr, partial_sum_ptr, seq_lens_ptr,
                          query_start_loc_ptr, out_ptr, num_heads, num_splits, split_size,
                          out_stride_t, out_stride_h, HEAD_SIZE: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_SPLITS: tl.constexpr):
    """Merge the partials of one (sequence, query head); splits past the sequence's
    context were never written and are not read."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    used_splits = tl.cdiv(tl.load(seq_lens_ptr + seq), split_size)
    splits = tl.arange(0, BLOCK_SPLITS)
    split_mask = splits < used_splits
    partial = (seq * num_heads + head) * num_splits + splits
    split_max = tl.load(partial_max_ptr + partial, mask=split_mask, other=float("-inf"))
    split_sum = tl.load(partial_sum_ptr + partial, mask=split_mask, other=0.0)
    overall_max = tl.max(split_max, axis=0)
    weights = tl.exp2(split_max - tl.where(overall_max == float("-inf"), 0.0, overall_max))
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < HEAD_SIZE
    split_acc = tl.load(partial_acc_ptr + partial[:, None] * HEAD_SIZE + dims[None, :],
                        mask=split_mask[:, None] & dim_mask[None, :], other=0.0)
    out = tl.sum(split_acc * weights[:, None], axis=0) / tl.sum(split_sum * weights, axis=0)
    token = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    tl.store(out_ptr + token * out_stride_t + head * out_stride_h + dims,
             out.to(out_ptr.dtype.element_ty), mask=dim_mask)
