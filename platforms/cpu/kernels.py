"""Kernel variants hwplug's CPU platforms add over the reference ops.

The references favour clarity and cover every case; these variants make fewer torch
calls per op, which is what costs most at the small shapes of CPU decoding. ``linear``
lives in :mod:`hwplug.platforms.cpu.onednn`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hwplug.kernel_registry.reference.cache import dequantize, quantize

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: KV-cache dtypes stored as one byte, written through a byte view and dequantised on read.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)

#: Largest gathered K/V copy :func:`decode_attention` makes. Past it the copy no longer
#: pays for itself and the reference's tiled online softmax wins. Measured interleaved on
#: a 2-core EPYC, fp32, SmolLM2 heads (9 query / 3 KV, D 64), time vs the reference:
#: 0.69x at 3.8 MiB, 0.80x at 7.5 MiB, 0.92x at 12 MiB, 1.1-1.2x at 24 MiB.
MAX_GATHER_BYTES = 16 << 20
#: Most queries per sequence the decode variants take, as one decode row per query token
#: (:meth:`~hwplug.attention.AttentionMetadata.decode_rows`): a speculative verify step's
#: ``k + 1`` tokens. Longer chunks are prefill, where the reference's dense path wins.
MAX_ROWS_QUERY = 16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The ``rms_norm`` op through torch's fused ``F.rms_norm`` (one pass per row)."""
    if residual is None:
        return F.rms_norm(x, weight.shape, weight, eps)
    summed = x + residual
    return F.rms_norm(summed, weight.shape, weight, eps), summed


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rotary_embedding`` op as ``x * cos + swap(x) * sin``: the cos and signed sin
    rows are expanded once per call and shared by query and key."""
    cos, sin = cos_sin_cache.index_select(0, positions).unsqueeze(-2).chunk(2, dim=-1)
    if is_neox:  # pairs (i, i + r/2): swap the halves
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)
    else:  # pairs (2i, 2i + 1): swap neighbours
        cos = cos.repeat_interleave(2, dim=-1)
        sin = torch.stack((-sin, sin), dim=-1).flatten(-2)
    return _rotate(query, cos, sin, is_neox), _rotate(key, cos, sin, is_neox)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool
            ) -> torch.Tensor:
    rot_dim = cos.shape[-1]
    rotated = x[..., :rot_dim]
    if is_neox:
        swapped = torch.cat(rotated.chunk(2, dim=-1)[::-1], dim=-1)
    else:
        swapped = rotated.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    out = torch.addcmul(rotated * cos, swapped, sin).to(x.dtype)  # fp32 cos/sin promote
    return out if rot_dim == x.shape[-1] else torch.cat((out, x[..., rot_dim:]), dim=-1)


def cache_supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why :func:`reshape_and_cache` declines a call, or None."""
    return None if kv_cache.is_contiguous() else "needs a contiguous kv_cache"


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache`` op as one ``index_copy_`` per half into the cache viewed
    as ``[2, num_slots, Hkv, D]`` (padding slots dropped first). fp8 caches, which torch's
    CPU ``index_copy_`` does not take, are written through a byte view."""
    slots = slot_mapping.long()
    keep = slots >= 0
    if not bool(keep.all()):
        slots, key, value = slots[keep], key[keep], value[keep]
    flat = kv_cache.view(2, -1, *kv_cache.shape[3:])
    byte_view = kv_cache.dtype in FP8_DTYPES
    for half, new, half_scale in ((flat[0], key, params.k_scale),
                                  (flat[1], value, params.v_scale)):
        stored = quantize(new, half_scale, kv_cache.dtype)
        if byte_view:
            half, stored = half.view(torch.uint8), stored.view(torch.uint8)
        half.index_copy_(0, slots, stored)


def rows_problem(query: torch.Tensor, metadata: AttentionMetadata,
                 params: PagedAttentionParams, max_query_len: int | None = MAX_ROWS_QUERY
                 ) -> str | None:
    """Why a decode kernel cannot serve a call as decode rows (one per query token), or
    None: a decode-only batch, or a causal one of at most ``max_query_len`` queries per
    sequence (None: any; the default, :data:`MAX_ROWS_QUERY`, a speculative verify step)."""
    if metadata.max_query_len == 1 and query.shape[0] == metadata.seq_lens.shape[0]:
        return None
    if max_query_len is not None and metadata.max_query_len > max_query_len:
        return (f"serves decode and verify batches (up to {max_query_len} queries per "
                f"sequence), got {metadata.max_query_len}")
    if not params.causal:
        return "serves several queries per sequence only under a causal mask"
    return None


def decode_supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                     params: PagedAttentionParams) -> str | None:
    """Why :func:`decode_attention` declines a call, or None."""
    if problem := rows_problem(query, metadata, params):
        return problem
    if params.soft_cap is not None:
        return "no soft cap (SDPA has none)"
    if kv_cache.dtype != query.dtype and kv_cache.dtype not in FP8_DTYPES:
        return (f"needs the KV cache in the query's dtype or fp8 ({kv_cache.dtype} != "
                f"{query.dtype})")
    block_size, num_kv_heads, head_size = kv_cache.shape[2:]
    gathered = (2 * query.shape[0] * -(-metadata.max_seq_len // block_size) * block_size
                * num_kv_heads * head_size * kv_cache.element_size())
    if gathered > MAX_GATHER_BYTES:
        return f"would gather {gathered >> 20} MiB of K/V (> {MAX_GATHER_BYTES >> 20} MiB)"
    return None


def decode_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                     params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op for decode batches: gather each sequence's blocks, then
    one ``scaled_dot_product_attention`` call with a key mask (the query is the last
    token, so causal and non-causal see the same keys). A causal batch of several queries
    per sequence runs as one decode row per query (``metadata.decode_rows``). An fp8
    cache is dequantised with its scales after the gather."""
    metadata = metadata.decode_rows(query.shape[0])
    num_seqs, block_size = query.shape[0], kv_cache.shape[2]
    num_blocks = -(-metadata.max_seq_len // block_size)
    tables = metadata.block_tables[:, :num_blocks].clamp(min=0).flatten()
    keys, values = kv_cache.index_select(1, tables).view(
        2, num_seqs, num_blocks * block_size, *kv_cache.shape[3:]).transpose(2, 3).unbind()
    k_scale, v_scale = params.k_scale, params.v_scale
    if kv_cache.dtype != query.dtype or k_scale is not None or v_scale is not None:
        keys = dequantize(keys, k_scale).to(query.dtype)
        values = dequantize(values, v_scale).to(query.dtype)
    key_positions = torch.arange(num_blocks * block_size)
    lens = metadata.seq_lens.long().unsqueeze(1)
    visible = key_positions < lens
    if params.sliding_window is not None:
        visible &= key_positions >= lens - params.sliding_window
    out = F.scaled_dot_product_attention(query.unsqueeze(2), keys, values,
                                         attn_mask=visible[:, None, None, :], scale=params.scale,
                                         enable_gqa=True)
    return out.squeeze(2)
