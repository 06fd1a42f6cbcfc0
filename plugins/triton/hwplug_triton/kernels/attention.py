"""``paged_attention`` with Triton: a split-KV decode kernel and a paged flash-attention
prefill kernel behind the op's one signature (layout NHD; :func:`attend` serves any).

Contract (the ``paged_attention`` op): ``query [T, Hq, D]`` over
``kv_cache [2, num_blocks, block_size, Hkv, D]`` (layout NHD) with the step's
``metadata`` (``block_tables [B, n]``, ``seq_lens [B]``, ``query_start_loc [B + 1]``, the
host-side maxima) and the layer's ``params``; sequence ``i``'s queries are the last
``q_len_i`` tokens of its ``seq_lens[i]``-token context. Key ``k`` is visible to the
query at position ``p`` iff ``(not causal or k <= p)`` and ``(sliding_window is None or
p - k < sliding_window)``; logits ``scale * q.k``, soft-capped if ``soft_cap``; softmax
in fp32; query head ``h`` reads KV head ``h // (Hq // Hkv)``; cached keys and values are
read as ``stored * k_scale`` / ``* v_scale`` when the scales are given. Returns a new
contiguous ``[T, Hq, D]`` in ``query.dtype``. Block-table entries past a sequence's
context are never read (they may be negative); the table must be wide enough.

Dispatch: every query length 1 -> :mod:`.decode_attention` (GQA-grouped, split-KV);
otherwise :mod:`.prefill_attention` serves the whole varlen batch, decode rows included.
The host-side ``max_query_len`` / ``max_seq_len`` avoid any device->host sync: the
decode test reads ``max_query_len`` and the decode grid ``max_seq_len``; the prefill grid
needs neither.

supports: queries fp32 / bf16 / fp16, caches in those or fp8 (e4m3fn, e5m2, fnuz) with
per-tensor or per-head scales, head size <= 256 (any, padded to a power of two), any
block size, ``Hq % Hkv == 0``; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug_triton.kernels import MAX_HEAD_SIZE, checked
from hwplug_triton.kernels.decode_attention import decode_attention
from hwplug_triton.kernels.layouts import (
    CACHE_DTYPES,
    COMPUTE_DTYPES,
    CacheView,
    head_scales,
    nhd_view,
    scale_problem,
)
from hwplug_triton.kernels.prefill_attention import prefill_attention

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams


def check_attention(query: torch.Tensor, view: CacheView, cache_dtype: torch.dtype,
                    metadata: AttentionMetadata, params: PagedAttentionParams) -> str | None:
    """Why :func:`attend` cannot serve the call over the cache ``view``, or None (no
    device sync)."""
    if query.dim() != 3:
        return f"expected query [T, Hq, D], got {tuple(query.shape)}"
    num_heads, head_size = query.shape[1:]
    if query.dtype not in COMPUTE_DTYPES:
        return f"query dtype {query.dtype} not in fp32, bf16, fp16"
    if query.stride(-1) != 1:
        return "query needs a unit stride in its last dimension"
    if cache_dtype not in CACHE_DTYPES:
        return f"kv_cache dtype {cache_dtype} not in fp32, bf16, fp16, fp8"
    if view.head_size != head_size or head_size > MAX_HEAD_SIZE:
        return f"head size {head_size} (cache {view.head_size}) must match and be " \
               f"<= {MAX_HEAD_SIZE}"
    if num_heads % view.num_kv_heads:
        return f"query heads {num_heads} not a multiple of KV heads {view.num_kv_heads}"
    num_seqs = metadata.seq_lens.shape[0]
    if metadata.query_start_loc.shape != (num_seqs + 1,) or \
            metadata.block_tables.shape[0] != num_seqs:
        return f"query_start_loc {tuple(metadata.query_start_loc.shape)} must be [B + 1] " \
               f"and block_tables {tuple(metadata.block_tables.shape)} [B, n] for B = {num_seqs}"
    return scale_problem(params.k_scale, params.v_scale, view.num_kv_heads)


def supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
              params: PagedAttentionParams) -> str | None:
    """Why these kernels cannot serve the call, or None (no device sync)."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return f"expected kv_cache [2, num_blocks, block_size, Hkv, D], got " \
               f"{tuple(kv_cache.shape)}"
    if kv_cache.stride(-1) != 1:
        return "kv_cache needs a unit stride in its last dimension"
    return check_attention(query, nhd_view(kv_cache), kv_cache.dtype, metadata, params)


@checked(supported)
def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op (see the module docstring)."""
    return attend(query, nhd_view(kv_cache), metadata, params)


def attend(query: torch.Tensor, view: CacheView, metadata: AttentionMetadata,
           params: PagedAttentionParams) -> torch.Tensor:
    """``paged_attention`` over the cache ``view`` (checked by :func:`check_attention`)."""
    num_tokens, num_seqs = query.shape[0], metadata.seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return query.new_empty(query.shape)
    scales = head_scales(params.k_scale, params.v_scale, view.num_kv_heads)
    if num_tokens == num_seqs and metadata.max_query_len == 1:
        return decode_attention(query, view, metadata, params, scales)
    return prefill_attention(query, view, metadata, params, scales)
