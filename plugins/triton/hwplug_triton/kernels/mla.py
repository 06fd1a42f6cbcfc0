"""``mla_attention``: multi-head latent attention (DeepSeek-V2/V3) with Triton over the
``MLA`` latent cache ``[num_blocks, block_size, L + R]`` (written by :mod:`.mla_cache`).

Contract: the op of :mod:`hwplug.kernel_registry.ops_mla`. Entry ``(b, s)`` of the cache
holds a token's latent ``c [L]`` then its roped shared key ``k_pe [R]``; an fp8 cache is
stored as ``x / kv_scale`` (clamped, rounded to nearest-even) and read as
``stored * kv_scale``.

``mla_attention`` computes every batch in the absorbed form, which the op's contract
allows for any query length ("the result is one"): ``q_lat = q_nope @ W_UK`` (a batched
matmul per head, in the query dtype), then :func:`_mla_kernel` attends ``[q_lat, q_pe]``
against the cached entries as one KV head shared by every query head (the latent part
and the rope part are two dots, so ``L + R = 576`` is never padded to 1024) with the
latents themselves as values, and ``W_UV`` is applied to the latent output after (a
second batched matmul). One program serves one query token and ``BLOCK_H`` of its heads,
reading its sequence's keys block by block through the block table, causal at the
token's position; each key tile is read once for all ``BLOCK_H`` heads. A decode-only
batch's contexts are split (flash-decoding, as ``paged_attention``'s decode kernel plans
and merges them), so one sequence with few head blocks still fills the GPU. The existing
paged-attention kernels are not reused for an expanded prefill: they need keys and values
of one head size (``N + R`` against ``V``) of at most 256.

supports: queries and weights fp32 / bf16 / fp16, caches in those or fp8 (OCP and fnuz)
with a one-element ``kv_scale``, ``L`` up to 1024 and ``R`` up to 256, any block size;
see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.kernels.attention_tiles import dot_operands
from hwplug_triton.kernels.decode_attention import (
    reduce_splits_kernel,
    split_partials,
    split_plan,
)
from hwplug_triton.kernels.layouts import COMPUTE_DTYPES
from hwplug_triton.kernels.mla_cache import cache_problem
from hwplug_triton.tuning import launch_config

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata


def supported(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
              metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
              scale: float, kv_scale: torch.Tensor | None = None) -> str | None:
    """Why :func:`mla_attention` cannot serve the call, or None (no device sync)."""
    if q_nope.dim() != 3 or q_pe.dim() != 3 or q_nope.shape[:2] != q_pe.shape[:2]:
        return f"expected q_nope [T, H, N] and q_pe [T, H, R], got {tuple(q_nope.shape)} " \
               f"and {tuple(q_pe.shape)}"
    heads, nope = q_nope.shape[1:]
    if w_uk.dim() != 3 or w_uv.dim() != 3 or tuple(w_uk.shape[:2]) != (heads, nope) or \
            w_uv.shape[0] != heads or w_uv.shape[2] != w_uk.shape[2]:
        return f"expected w_uk [{heads}, {nope}, L] and w_uv [{heads}, V, L], got " \
               f"{tuple(w_uk.shape)} and {tuple(w_uv.shape)}"
    dtypes = {q_nope.dtype, q_pe.dtype, w_uk.dtype, w_uv.dtype}
    if len(dtypes) != 1 or q_nope.dtype not in COMPUTE_DTYPES:
        return f"queries and weights must share one of fp32, bf16, fp16, got " \
               f"{sorted(map(str, dtypes))}"
    num_seqs = metadata.seq_lens.shape[0]
    if metadata.query_start_loc.shape != (num_seqs + 1,) or \
            metadata.block_tables.shape[0] != num_seqs:
        return f"query_start_loc {tuple(metadata.query_start_loc.shape)} must be [B + 1] " \
               f"and block_tables {tuple(metadata.block_tables.shape)} [B, n] for B = {num_seqs}"
    return cache_problem(kv_cache, w_uk.shape[2], q_pe.shape[2], kv_scale)


@checked(supported)
def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                  metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                  scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The ``mla_attention`` op in the absorbed form (see the module docstring); returns
    ``[T, H, V]`` in ``q_nope.dtype``."""
    return absorbed_attention(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale, kv_scale)


def absorbed_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                       scale: float, kv_scale: torch.Tensor | None = None,
                       split_size: int | None = None) -> torch.Tensor:
    """:func:`mla_attention`; a decode-only batch's contexts are split as
    :func:`~hwplug_triton.kernels.decode_attention.split_plan` plans for its programs
    (``split_size`` keys per split, rounded up to the key tile, overrides the tuned
    choice), other batches are not split."""
    num_tokens, num_heads = q_nope.shape[:2]
    latent, rope = w_uk.shape[2], q_pe.shape[2]
    if num_tokens == 0 or metadata.seq_lens.shape[0] == 0:
        return q_nope.new_zeros((num_tokens, num_heads, w_uv.shape[1]))
    q_lat = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, L]
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    out = q_lat.new_empty((num_tokens, num_heads, latent))
    token_seqs = torch.searchsorted(metadata.query_start_loc[1:].to(torch.int64),
                                    torch.arange(num_tokens, device=q_lat.device), right=True)
    config = launch_config("mla_attention", q_lat.device, latent)
    block_h = min(config["block_h"], max(16, triton.next_power_of_2(num_heads)))
    head_blocks, max_seq_len = triton.cdiv(num_heads, block_h), metadata.max_seq_len
    keys_per_split, num_splits = max_seq_len, 1
    if num_tokens == metadata.seq_lens.shape[0] and metadata.max_query_len == 1:
        keys_per_split, num_splits = split_plan(num_tokens * head_blocks, max_seq_len, config,
                                                q_lat.device, split_size)
    partial_acc, partial_max, partial_sum = split_partials(out, num_tokens, num_heads,
                                                           num_splits, latent)
    block_l, tables = max(16, triton.next_power_of_2(latent)), metadata.block_tables
    _mla_kernel[(num_tokens, head_blocks, num_splits)](
        q_lat, q_pe, kv_cache, kv_scale if kv_scale is not None else q_lat, tables,
        metadata.seq_lens, metadata.query_start_loc, token_seqs, out, partial_acc,
        partial_max, partial_sum, num_heads, num_splits, keys_per_split, scale,
        q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
        out.stride(0), out.stride(1), kv_cache.stride(0), kv_cache.stride(1),
        tables.stride(0), SCALED=kv_scale is not None, SPLIT=num_splits > 1,
        BLOCK_SIZE=kv_cache.shape[1], LATENT=latent, ROPE=rope, BLOCK_L=block_l,
        BLOCK_R=max(16, triton.next_power_of_2(rope)), BLOCK_H=block_h,
        BLOCK_N=config["block_n"], **dot_operands(q_lat.dtype, q_lat.device),
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if num_splits > 1:
        reduce_splits_kernel[(num_tokens, num_heads)](
            partial_acc, partial_max, partial_sum, metadata.seq_lens,
            metadata.query_start_loc, out, num_heads, num_splits, keys_per_split, out.stride(0),
            out.stride(1), HEAD_SIZE=latent, BLOCK_D=block_l,
            BLOCK_SPLITS=triton.next_power_of_2(num_splits))
    return torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1).contiguous()


@triton.jit
def _mla_kernel(q_lat_ptr, q_pe_ptr, cache_ptr, kv_scale_ptr, block_tables_ptr, seq_lens_ptr,
                query_start_loc_ptr, token_seqs_ptr, out_ptr, partial_acc_ptr,
                partial_max_ptr, partial_sum_ptr, num_heads, num_splits, split_size, scale,
                q_lat_stride_t, q_lat_stride_h, q_pe_stride_t, q_pe_stride_h,
                out_stride_t, out_stride_h, cache_block, cache_slot, block_table_stride,
                SCALED: tl.constexpr, SPLIT: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                LATENT: tl.constexpr,
                ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, WIDEN_DOT: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    """Online softmax of ``BLOCK_H`` heads of one query token over the keys of split
    ``program_id(2)`` that its causal position sees; scores in log2 units (``exp2``), a
    cache scale folded into the score scale (keys) and the accumulator (values). Split:
    the unnormalised partial (accumulator, running max, running sum) of a decode row, which
    ``reduce_splits_kernel`` merges."""
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    head_mask = heads < num_heads
    seq = tl.load(token_seqs_ptr + token)
    first = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - first
    key_start = split * split_size
    key_end = tl.load(seq_lens_ptr + seq) - query_len + (token - first) + 1  # causal
    if key_start >= key_end:
        return
    key_end = tl.minimum(key_end, key_start + split_size)
    lat = tl.arange(0, BLOCK_L)
    pe = tl.arange(0, BLOCK_R)
    q_lat = tl.load(q_lat_ptr + token * q_lat_stride_t + heads[:, None] * q_lat_stride_h
                    + lat[None, :], mask=head_mask[:, None] & (lat < LATENT)[None, :], other=0.0)
    q_pe = tl.load(q_pe_ptr + token * q_pe_stride_t + heads[:, None] * q_pe_stride_h
                   + pe[None, :], mask=head_mask[:, None] & (pe < ROPE)[None, :], other=0.0)
    if WIDEN_DOT:
        q_lat = q_lat.to(tl.float32)
        q_pe = q_pe.to(tl.float32)
    kv_scale = 1.0
    if SCALED:
        kv_scale = tl.load(kv_scale_ptr)
    score_scale = scale * kv_scale * 1.4426950408889634  # log2(e)
    acc = tl.zeros([BLOCK_H, BLOCK_L], dtype=tl.float32)
    row_max = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * block_table_stride
    for tile_start in range(key_start, key_end, BLOCK_N):
        keys = tile_start + tl.arange(0, BLOCK_N)
        in_range = keys < key_end
        blocks = tl.load(table + keys // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        entries = cache_ptr + blocks * cache_block + (keys % BLOCK_SIZE) * cache_slot
        k_lat = tl.load(entries[:, None] + lat[None, :],
                        mask=in_range[:, None] & (lat < LATENT)[None, :], other=0.0)
        k_pe = tl.load(entries[:, None] + LATENT + pe[None, :],
                       mask=in_range[:, None] & (pe < ROPE)[None, :], other=0.0)
        k_lat = k_lat.to(q_lat.dtype)
        scores = tl.dot(q_lat, tl.trans(k_lat), input_precision=DOT_PRECISION)
        scores += tl.dot(q_pe, tl.trans(k_pe.to(q_pe.dtype)), input_precision=DOT_PRECISION)
        scores = tl.where(in_range[None, :], scores * score_scale, float("-inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        weights = tl.exp2(scores - new_max[:, None])
        rescale = tl.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.dot(weights.to(q_lat.dtype), k_lat,
                                              input_precision=DOT_PRECISION)
        row_max = new_max
    acc = acc * kv_scale
    mask = head_mask[:, None] & (lat < LATENT)[None, :]
    if SPLIT:
        partial = (token * num_heads + heads) * num_splits + split
        tl.store(partial_acc_ptr + partial[:, None] * LATENT + lat[None, :], acc, mask=mask)
        tl.store(partial_max_ptr + partial, row_max, mask=head_mask)
        tl.store(partial_sum_ptr + partial, row_sum, mask=head_mask)
    else:
        out = acc / row_sum[:, None]
        tl.store(out_ptr + token * out_stride_t + heads[:, None] * out_stride_h + lat[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=mask)
