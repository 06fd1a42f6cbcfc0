"""Attention over a paged KV cache: prefill, chunked prefill and decode, mixed in one call.

The queries are padded per sequence to ``[B, Qmax]``, then take one of two routes, both
fp32 inside:

* tiled: each sequence's context is read one tile of KV blocks at a time and merged
  with an online (running-max) softmax, so no ``[B, Lmax]`` copy of the cache and no
  ``[Qmax, Lmax]`` score matrix is built. Decode-only batches (memory-bound) and
  soft-capped attention take it.
* dense: ``scaled_dot_product_attention`` with a visibility mask over an fp32 copy of
  the gathered K/V, for prefill and mixed batches (compute-bound, where the fused
  kernel wins; it has no soft cap).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.cache import dequantize
from hwplug.kv_cache_layout import NHD, checked_reference

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: Bytes of fp32 keys plus scores per tile: small enough that a tile's buffers stay in a
#: server CPU's last-level cache, large enough that the per-tile Python overhead is small
#: next to the copies and matmuls (8 MiB measured best from 1 to 64 sequences on x86).
_TILE_BYTES = 8 << 20
#: Score of a hidden key. Finite, so a tile that hides all of a row's keys (its sliding
#: window starts later) gives that row a finite running max instead of NaN; exp() of it
#: relative to any real score is exactly 0, so it never leaks into the result.
_HIDDEN = torch.finfo(torch.float32).min


@torch.no_grad()
def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """Attention of packed ``query [T, Hq, D]`` over ``kv_cache`` in layout ``params.layout``.

    ``kv_cache`` is read as the ``NHD`` cache ``[2, num_blocks, block_size, Hkv, D]`` its
    layout's ``to_reference`` gives (the ``NHD`` cache itself; any other registered layout
    converted, after its ``check``), so the reference serves every layout.

    Sequence ``i`` owns queries ``query[qsl[i]:qsl[i+1]]`` (``qsl =
    metadata.query_start_loc [B+1]``), the last ``q_len_i`` tokens of its
    ``seq_lens[i]``-token context, whose keys and values are already cached: token ``k`` at
    block ``block_tables[i, k // block_size]``, offset ``k % block_size``. Query ``j`` sits
    at ``p = seq_lens[i] - q_len_i + j`` and sees key ``k < seq_lens[i]`` as ``params``
    says (causal, sliding window); scores are ``params.scale * q.k``, soft-capped when
    ``params.soft_cap`` is set; softmax in fp32. Query head ``h`` reads KV head
    ``h // (Hq // Hkv)``. Cached keys and values are read as ``stored.float() * k_scale`` /
    ``* v_scale`` when ``params`` has the scales (an fp8 cache).

    Block-table entries past a sequence's last block are ignored; they may be any valid
    block id or negative (padding). Cache slots past a sequence's length must hold finite
    values (a zero-initialised cache does): they are read, then weighted by exactly 0. The
    call never synchronises with the device (``metadata`` holds the host-side maxima).
    Returns ``[T, Hq, D]`` in ``query.dtype`` (inference only: no autograd history).
    Raises :class:`~hwplug.errors.UnsupportedError` for a cache not in its layout,
    mismatched shapes, ``Hq % Hkv != 0`` or block tables too narrow for ``max_seq_len``.
    """
    if params.layout is not NHD:
        kv_cache = checked_reference(params.layout, kv_cache)
    _check_args(query, kv_cache)
    num_tokens, num_seqs, block_size = query.shape[0], metadata.seq_lens.shape[0], kv_cache.shape[2]
    if num_tokens == 0 or num_seqs == 0:
        return query.new_empty(query.shape)
    seq_lens, query_start_loc = metadata.seq_lens.long(), metadata.query_start_loc
    max_query_len, max_seq_len = metadata.max_query_len, metadata.max_seq_len
    starts = query_start_loc[:-1].long()
    query_lens = query_start_loc[1:].long() - starts

    decode_only = max_query_len == 1 and num_tokens == num_seqs  # then every q_len is 1
    if decode_only:
        padded, offsets = query.unsqueeze(1), query_lens.new_zeros(num_seqs, 1)
    else:
        padded, offsets = _pad_queries(query, starts, query_lens, max_query_len)
    positions = (seq_lens - query_lens)[:, None] + offsets  # [B, Qmax]
    first_visible, end_visible = _visible_keys(positions, seq_lens, params.causal,
                                               params.sliding_window)
    num_used_blocks = -(-max_seq_len // block_size)
    block_tables = metadata.block_tables
    if block_tables.shape[1] < num_used_blocks:
        raise UnsupportedError(f"block_tables has {block_tables.shape[1]} columns; "
                               f"{max_seq_len} tokens need {num_used_blocks}")
    tables = block_tables[:, :num_used_blocks].long().clamp(min=0)

    kv_scales = (params.k_scale, params.v_scale)
    if decode_only or params.soft_cap is not None:
        out = _tiled_attention(padded.float() * params.scale, kv_cache, tables, first_visible,
                               end_visible, params.soft_cap, kv_scales)
    else:
        out = _dense_attention(padded.float(), kv_cache, tables, first_visible, end_visible,
                               params.scale, kv_scales)
    out = out.to(query.dtype)
    if decode_only:
        return out.squeeze(1)
    return out.flatten(0, 1)[_packed_row_index(query_start_loc, max_query_len, num_tokens)]


def _check_args(query: torch.Tensor, kv_cache: torch.Tensor) -> None:
    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise UnsupportedError(
            "expected query [T, Hq, D] and kv_cache [2, num_blocks, block_size, Hkv, D], got "
            f"{tuple(query.shape)} and {tuple(kv_cache.shape)}"
        )
    num_heads, head_size = query.shape[1:]
    num_kv_heads, kv_head_size = kv_cache.shape[3:]
    if head_size != kv_head_size:
        raise UnsupportedError(f"query head size {head_size} != KV head size {kv_head_size}")
    if num_heads % num_kv_heads:
        raise UnsupportedError(
            f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})"
        )


def _pad_queries(
    query: torch.Tensor, starts: torch.Tensor, query_lens: torch.Tensor, max_query_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``query`` as ``[B, Qmax, Hq, D]``, and the ``[B, Qmax]`` index of each row within its
    sequence. Padding rows repeat their sequence's last query, so none sees no key."""
    offsets = torch.arange(max_query_len, device=query.device)
    offsets = torch.minimum(offsets, (query_lens - 1).clamp(min=0)[:, None])
    return query[(starts[:, None] + offsets).clamp(max=query.shape[0] - 1)], offsets


def _packed_row_index(
    query_start_loc: torch.Tensor, max_query_len: int, num_tokens: int
) -> torch.Tensor:
    """``[T]`` row of each packed token in the flattened ``[B * Qmax]`` padded layout."""
    tokens = torch.arange(num_tokens, device=query_start_loc.device)
    seq = torch.searchsorted(query_start_loc[1:].long(), tokens, right=True)
    return seq * max_query_len + tokens - query_start_loc.long()[seq]


def _visible_keys(
    positions: torch.Tensor, seq_lens: torch.Tensor, causal: bool, sliding_window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys the query at ``positions [B, Qmax]`` sees form the range ``[first, end)``;
    both are returned as ``[B, Qmax, 1]``."""
    end = seq_lens[:, None].expand_as(positions)
    if causal:
        end = torch.minimum(end, positions + 1)
    first = torch.zeros_like(positions)
    if sliding_window is not None:
        first = positions - (sliding_window - 1)
    return first[..., None], end[..., None]


def _dense_attention(
    queries: torch.Tensor,
    kv_cache: torch.Tensor,
    tables: torch.Tensor,
    first_visible: torch.Tensor,
    end_visible: torch.Tensor,
    scale: float,
    kv_scales: tuple[torch.Tensor | None, torch.Tensor | None],
) -> torch.Tensor:
    """SDPA of fp32 ``queries [B, Qmax, Hq, D]`` over the blocks in ``tables [B, n]``;
    returns fp32 ``[B, Qmax, Hq, D]``."""
    num_seqs, num_blocks = tables.shape
    block_size, num_kv_heads, head_size = kv_cache.shape[2:]
    gathered = kv_cache.index_select(1, tables.flatten())  # [2, B * n, block_size, Hkv, D]
    keys, values = (dequantize(part, part_scale) for part, part_scale in zip(
        gathered.view(2, num_seqs, num_blocks * block_size, num_kv_heads,
                      head_size).transpose(2, 3).unbind(), kv_scales, strict=True))
    key_positions = torch.arange(keys.shape[2], device=keys.device)
    visible = (key_positions >= first_visible) & (key_positions < end_visible)
    out = F.scaled_dot_product_attention(queries.transpose(1, 2), keys, values,
                                         attn_mask=visible.unsqueeze(1), scale=scale,
                                         enable_gqa=True)
    return out.transpose(1, 2)


def _tiled_attention(
    queries: torch.Tensor,
    kv_cache: torch.Tensor,
    tables: torch.Tensor,
    first_visible: torch.Tensor,
    end_visible: torch.Tensor,
    soft_cap: float | None,
    kv_scales: tuple[torch.Tensor | None, torch.Tensor | None],
) -> torch.Tensor:
    """Online-softmax attention of pre-scaled fp32 ``queries [B, Qmax, Hq, D]`` over the
    blocks in ``tables [B, n]``; returns fp32 ``[B, Qmax, Hq, D]``."""
    num_seqs, max_query_len, num_heads, head_size = queries.shape
    block_size, num_kv_heads = kv_cache.shape[2:4]
    group = num_heads // num_kv_heads
    # The (query, head-in-group) rows of one KV head side by side: [B, Hkv, Qmax * G, D].
    rows = queries.view(num_seqs, max_query_len, num_kv_heads, group, head_size)
    rows = rows.transpose(1, 2).reshape(num_seqs, num_kv_heads, max_query_len * group, head_size)

    tile = _tile_blocks(tables.shape[1], num_seqs, num_kv_heads, head_size, rows.shape[2],
                        block_size)
    # Pad the tables to whole tiles; the padding lies past every seq_len, so it is hidden.
    tables = F.pad(tables, (0, -tables.shape[1] % tile))
    key_positions = torch.arange(tables.shape[1] * block_size, device=rows.device)
    staging = kv_cache.new_empty((num_seqs * tile, *kv_cache.shape[2:]))
    kv_tile = rows.new_empty((num_seqs, num_kv_heads, tile * block_size, head_size))
    scores = rows.new_empty((*rows.shape[:3], tile * block_size))
    weighted_values = torch.empty_like(rows)

    running_max = rows.new_full((*rows.shape[:3], 1), _HIDDEN)
    denominator = torch.zeros_like(running_max)
    acc = torch.zeros_like(rows)
    for first in range(0, tables.shape[1], tile):
        blocks = tables[:, first:first + tile].flatten()
        keys = _gather_tile(kv_cache[0], blocks, staging, kv_tile, kv_scales[0])
        torch.matmul(rows, keys.transpose(-1, -2), out=scores)  # [B, Hkv, Qmax * G, l]
        if soft_cap is not None:
            scores.div_(soft_cap).tanh_().mul_(soft_cap)
        tile_keys = key_positions[first * block_size:(first + tile) * block_size]
        hidden = (tile_keys < first_visible) | (tile_keys >= end_visible)  # [B, Qmax, l]
        scores.view(num_seqs, num_kv_heads, max_query_len, group, -1).masked_fill_(
            hidden[:, None, :, None], _HIDDEN
        )
        new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
        weights = scores.sub_(new_max).exp_()
        rescale = (running_max - new_max).exp_()
        denominator.mul_(rescale).add_(weights.sum(dim=-1, keepdim=True))
        values = _gather_tile(kv_cache[1], blocks, staging, kv_tile, kv_scales[1])
        acc.mul_(rescale).add_(torch.matmul(weights, values, out=weighted_values))
        running_max = new_max
    out = (acc / denominator).view(num_seqs, num_kv_heads, max_query_len, group, head_size)
    return out.transpose(1, 2).reshape(queries.shape)


def _tile_blocks(
    num_blocks: int, num_seqs: int, num_kv_heads: int, head_size: int, rows: int,
    block_size: int,
) -> int:
    """Blocks per tile: as many as keep one tile's fp32 keys and scores within
    ``_TILE_BYTES``, evened out so the last tile is about as full as the others."""
    bytes_per_block = 4 * num_seqs * num_kv_heads * (head_size + rows) * block_size
    num_tiles = max(1, -(-num_blocks // max(1, _TILE_BYTES // bytes_per_block)))
    return max(1, -(-num_blocks // num_tiles))


def _gather_tile(
    cache: torch.Tensor, blocks: torch.Tensor, staging: torch.Tensor, out: torch.Tensor,
    scale: torch.Tensor | None,
) -> torch.Tensor:
    """Copy ``cache [num_blocks, block_size, Hkv, D]`` at ``blocks [B * n]`` into fp32
    ``out [B, Hkv, n * block_size, D]``, through ``staging [B * n, block_size, Hkv, D]``,
    times ``scale`` when given."""
    torch.index_select(cache, 0, blocks, out=staging)
    out.copy_(staging.view(out.shape[0], -1, *cache.shape[2:]).transpose(1, 2))
    return out if scale is None else out.mul_(scale.float().reshape(-1, 1, 1))
