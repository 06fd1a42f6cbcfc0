"""Multi-head latent attention over the ``MLA`` latent cache, in its two forms.

The cache ``[num_blocks, block_size, L + R]`` holds each token's normalised latent
``c_kv [L]`` then its roped shared key ``k_pe [R]``. :func:`mla_expanded` expands the
context's keys and values per head (``k = [W_UK c_kv, k_pe]``, ``v = W_UV c_kv``) and
attends with ``q = [q_nope, q_pe]``: prefill's form. :func:`mla_absorbed` folds ``W_UK``
into the query (``q = [q_nope W_UK, q_pe]``), attends against the latents as one shared
KV head (values: the latents' first ``L`` columns) and applies ``W_UV`` after: decode's
form. They are the same function: ``q_nope . (W_UK c) = (q_nope W_UK) . c``. Both gather
each sequence's blocks and pad queries per sequence, fp32 inside, no per-token Python
loop: the expanded form runs ``scaled_dot_product_attention`` under a causal mask, the
absorbed one two matmuls per sequence with every head's queries as rows against the one
latent head (no per-head copy of the latents).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.attention import (
    _packed_row_index,
    _pad_queries,
    _visible_keys,
)
from hwplug.kernel_registry.reference.cache import quantize

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata

__all__ = ["concat_and_cache_mla", "mla_absorbed", "mla_attention", "mla_expanded"]

#: ``latents [B, S, L + R]`` fp32 -> keys ``[B, Hk, S, Dq]`` and values ``[B, Hk, S, Dv]``.
KeysValues = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


@torch.no_grad()
def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None
                         ) -> None:
    """Store ``[kv_c [T, L], k_pe [T, R]]`` of token ``t`` at slot ``s = slot_mapping[t]`` of
    ``kv_cache [num_blocks, block_size, L + R]`` (block ``s // block_size``, offset ``s %
    block_size``), divided by ``kv_scale`` (float32 ``[]``, an fp8 cache's) when given and
    cast to the cache dtype (fp8 saturating). A negative slot is skipped; in place."""
    if kv_cache.dim() != 3 or kv_c.shape[-1] + k_pe.shape[-1] != kv_cache.shape[-1]:
        raise UnsupportedError(f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} do not "
                               f"fill an MLA cache [num_blocks, block_size, L + R] "
                               f"{tuple(kv_cache.shape)}")
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    entries = torch.cat((kv_c[keep], k_pe[keep]), dim=-1)
    block_size = kv_cache.shape[1]
    kv_cache[slots // block_size, slots % block_size] = quantize(entries, kv_scale,
                                                                 kv_cache.dtype)


@torch.no_grad()
def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                  metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                  scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal latent attention of ``q_nope [T, H, N]`` and ``q_pe [T, H, R]`` over the
    cached context (see :func:`mla_expanded`): a decode-only batch in the absorbed form,
    any other in the expanded form. Returns ``[T, H, V]`` in ``q_nope.dtype``."""
    decode_only = metadata.max_query_len == 1 and q_nope.shape[0] == metadata.seq_lens.shape[0]
    form = mla_absorbed if decode_only else mla_expanded
    return form(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale, kv_scale)


@torch.no_grad()
def mla_expanded(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                 metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                 scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The expanded form. Sequence ``i``'s queries ``[qsl[i], qsl[i+1])`` are the last
    tokens of its context of ``seq_lens[i]`` cached tokens (read through
    ``block_tables[i]``, times ``kv_scale`` when given); the query at position ``p`` sees
    keys ``k <= p``. Head ``h``'s key of token ``s`` is ``[w_uk[h] @ c_s, k_pe_s]``, its
    value ``w_uv[h] @ c_s`` (``w_uk [H, N, L]``, ``w_uv [H, V, L]``); scores ``scale *
    q.k``. Returns ``[T, H, V]`` in ``q_nope.dtype``."""
    heads, kv_lora = w_uk.shape[0], w_uk.shape[2]
    uk, uv = w_uk.float(), w_uv.float()

    def expand(latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, k_pe = latents[..., :kv_lora], latents[..., kv_lora:]
        k_nope = torch.einsum("bsl,hnl->bhsn", c, uk)
        keys = torch.cat((k_nope, k_pe[:, None].expand(-1, heads, -1, -1)), dim=-1)
        return keys, torch.einsum("bsl,hvl->bhsv", c, uv)

    query = torch.cat((q_nope.float(), q_pe.float()), dim=-1)
    out = _attend(query, kv_cache, metadata, expand, scale, kv_scale, w_uv.shape[1])
    return out.to(q_nope.dtype)


@torch.no_grad()
def mla_absorbed(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                 metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                 scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The absorbed form of :func:`mla_expanded` (same arguments, same result): queries
    ``[q_nope @ w_uk, q_pe]`` against the latents as one KV head, the latent output of
    each head times ``w_uv`` after attention."""
    kv_lora = w_uk.shape[2]

    def latent(latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shared = latents[:, None]  # [B, 1, S, L + R]: one KV head for every query head
        return shared, shared[..., :kv_lora]

    query = torch.cat((torch.einsum("thn,hnl->thl", q_nope.float(), w_uk.float()),
                       q_pe.float()), dim=-1)
    out = _attend(query, kv_cache, metadata, latent, scale, kv_scale, kv_lora)
    return torch.einsum("thl,hvl->thv", out, w_uv.float()).to(q_nope.dtype)


def _attend(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
            keys_values: KeysValues, scale: float, kv_scale: torch.Tensor | None,
            value_size: int) -> torch.Tensor:
    """Causal SDPA of fp32 ``query [T, H, Dq]`` over each sequence's cached latents, turned
    into keys and values by ``keys_values``; returns fp32 ``[T, H, value_size]``."""
    num_tokens, num_heads = query.shape[:2]
    num_seqs, block_size = metadata.seq_lens.shape[0], kv_cache.shape[1]
    if num_tokens == 0 or num_seqs == 0:
        return query.new_zeros((num_tokens, num_heads, value_size))
    num_used = -(-metadata.max_seq_len // block_size)
    if metadata.block_tables.shape[1] < num_used:
        raise UnsupportedError(f"block_tables has {metadata.block_tables.shape[1]} columns; "
                               f"{metadata.max_seq_len} tokens need {num_used}")
    tables = metadata.block_tables[:, :num_used].long().clamp(min=0)
    latents = kv_cache.index_select(0, tables.flatten()).float()
    if kv_scale is not None:
        latents = latents * kv_scale.float()
    keys, values = keys_values(latents.view(num_seqs, num_used * block_size, -1))

    seq_lens, qsl = metadata.seq_lens.long(), metadata.query_start_loc
    starts = qsl[:-1].long()
    query_lens = qsl[1:].long() - starts
    padded, offsets = _pad_queries(query, starts, query_lens, metadata.max_query_len)
    first, end = _visible_keys((seq_lens - query_lens)[:, None] + offsets, seq_lens, True, None)
    key_positions = torch.arange(keys.shape[2], device=keys.device)
    visible = (key_positions >= first) & (key_positions < end)  # [B, Qmax, S]
    if keys.shape[1] == 1:  # one latent head for all: heads are more query rows (no copies)
        scores = torch.matmul(padded.flatten(1, 2), keys[:, 0].transpose(1, 2)).mul_(scale)
        scores = scores.view(*padded.shape[:3], -1).masked_fill_(~visible[:, :, None],
                                                                 float("-inf"))
        out = torch.matmul(scores.softmax(-1).flatten(1, 2), values[:, 0])
        out = out.view(*padded.shape[:3], value_size)
    else:
        out = F.scaled_dot_product_attention(padded.transpose(1, 2), keys, values,
                                             attn_mask=visible.unsqueeze(1),
                                             scale=scale).transpose(1, 2)
    rows = _packed_row_index(qsl, metadata.max_query_len, num_tokens)
    return out.flatten(0, 1)[rows]
