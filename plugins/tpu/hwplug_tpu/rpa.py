"""Ragged paged attention in JAX over the interleaved KV layout, with the inputs of JAX's
Pallas TPU kernel.

Inputs (all static shapes, padded to buckets by the caller): ``queries [T, Hq, D]``,
``kv_pages [num_pages, page_size, 2 * Hkv, D]`` (KV head ``h``'s key at head index
``2h``, its value at ``2h + 1``), int32 ``kv_lens [S]``, ``page_indices [S,
pages_per_seq]``, ``cu_q_lens [S + 1]`` and ``num_seqs [1]``. Sequence ``i < num_seqs``
owns queries ``cu_q_lens[i]:cu_q_lens[i + 1]``, the last tokens of its ``kv_lens[i]``
cached tokens; attention is causal, optionally windowed and soft-capped. Padding
sequences have no queries; padding query rows return zeros.

:func:`ragged_paged_attention` is the pure-JAX version (any JAX backend);
:func:`pallas_ragged_paged_attention` runs JAX's Pallas TPU kernel
(``jax.experimental.pallas.ops.tpu.ragged_paged_attention``) on the same inputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

_F32 = jnp.float32
#: Score of a hidden key: finite, so a row that sees no key stays finite (and is dropped).
HIDDEN = float(jnp.finfo(_F32).min)


def ragged_queries(queries: jax.Array, kv_lens: jax.Array, cu_q_lens: jax.Array,
                   num_seqs: jax.Array, max_q_len: int
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The ragged ``queries [T, ...]`` per sequence: fp32 ``[S, max_q_len, ...]`` (sequence
    ``i``'s rows ``cu_q_lens[i]:cu_q_lens[i + 1]`` first), each row's position in its
    sequence ``[S, max_q_len]``, and each row's token index ``[S * max_q_len]`` for
    :func:`unpad` (``T``, out of range, for padding rows)."""
    num_tokens = queries.shape[0]
    live = jnp.arange(kv_lens.shape[0]) < num_seqs[0]
    q_lens = jnp.where(live, cu_q_lens[1:] - cu_q_lens[:-1], 0)
    offsets = jnp.arange(max_q_len)
    rows = cu_q_lens[:-1, None] + offsets  # [S, Qmax]: token index of each padded query
    padded = queries[jnp.clip(rows, 0, num_tokens - 1)].astype(_F32)
    positions = kv_lens[:, None] - q_lens[:, None] + offsets
    target = jnp.where(offsets < q_lens[:, None], rows, num_tokens).reshape(-1)
    return padded, positions, target


def visible_keys(positions: jax.Array, kv_lens: jax.Array, num_keys: int,
                 sliding_window: int | None = None) -> jax.Array:
    """``[S, Qmax, num_keys]``: whether the query at ``positions [S, Qmax]`` sees key ``k`` of
    its sequence (causal, within its ``kv_lens``, and the window when given)."""
    key_pos = jnp.arange(num_keys)
    visible = (key_pos <= positions[..., None]) & (key_pos < kv_lens[:, None, None])
    if sliding_window is not None:
        visible &= positions[..., None] - key_pos < sliding_window
    return visible


def unpad(out: jax.Array, target: jax.Array, num_tokens: int) -> jax.Array:
    """``out [S * Qmax, ...]`` back to the ragged ``[num_tokens, ...]`` (:func:`ragged_queries`'
    ``target``); tokens no sequence owns are zeros."""
    return jnp.zeros((num_tokens, *out.shape[1:]), out.dtype).at[target].set(out, mode="drop")


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "max_q_len"))
def ragged_paged_attention(queries: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array,
                           page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array,
                           *, sm_scale: float, sliding_window: int | None,
                           soft_cap: float | None, max_q_len: int) -> jax.Array:
    """Attention of ``queries`` over their sequences' cached keys; ``max_q_len`` bounds
    every sequence's query count (its bucket). fp32 inside; returns ``queries.dtype``."""
    num_tokens, num_heads, head_size = queries.shape
    num_slots, pages_per_seq = page_indices.shape
    page_size, num_kv_heads = kv_pages.shape[1], kv_pages.shape[2] // 2
    group = num_heads // num_kv_heads
    q, positions, target = ragged_queries(queries, kv_lens, cu_q_lens, num_seqs, max_q_len)
    q = q.reshape(num_slots, max_q_len, num_kv_heads, group, head_size)

    pages = kv_pages[page_indices].reshape(num_slots, pages_per_seq * page_size,
                                           num_kv_heads, 2, head_size).astype(_F32)
    keys, values = pages[..., 0, :], pages[..., 1, :]  # [S, L, Hkv, D]
    scores = jnp.einsum("sqhgd,slhd->shgql", q, keys) * sm_scale
    if soft_cap is not None:
        scores = soft_cap * jnp.tanh(scores / soft_cap)
    visible = visible_keys(positions, kv_lens, keys.shape[1], sliding_window)
    scores = jnp.where(visible[:, None, None], scores, HIDDEN)
    weights = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("shgql,slhd->sqhgd", weights, values)
    out = out.reshape(num_slots * max_q_len, num_heads, head_size).astype(queries.dtype)
    return unpad(out, target, num_tokens)


@functools.partial(jax.jit, static_argnames=("sm_scale", "sliding_window", "soft_cap",
                                             "max_q_len", "block_sizes"))
def pallas_ragged_paged_attention(queries: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array,
                                  page_indices: jax.Array, cu_q_lens: jax.Array,
                                  num_seqs: jax.Array, *, sm_scale: float,
                                  sliding_window: int | None, soft_cap: float | None,
                                  max_q_len: int | None = None,
                                  block_sizes: tuple[int, int] | None = None) -> jax.Array:
    """JAX's Pallas TPU kernel on the same inputs (TPU v4 or newer); it needs no
    ``max_q_len``. ``block_sizes`` (KV pages, queries per block) default to the kernel's
    tuned table, which asks the TPU's version; give them to run in Pallas' TPU interpret
    mode. Padding query rows are zeroed to match :func:`ragged_paged_attention`."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import (
        ragged_paged_attention as kernel,
    )

    del max_q_len  # the kernel walks each sequence's queries itself
    pages_per_block, queries_per_block = block_sizes or (None, None)
    out = kernel(queries, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
                 sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                 num_kv_pages_per_block=pages_per_block, num_queries_per_block=queries_per_block)
    used = jnp.arange(queries.shape[0]) < cu_q_lens[num_seqs[0]]
    return jnp.where(used[:, None, None], out, 0).astype(queries.dtype)
