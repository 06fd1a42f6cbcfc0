"""Multi-head latent attention in JAX over the ``MLA`` latent cache, with the ragged batch
inputs of :mod:`hwplug_tpu.rpa`.

The cache is hwplug's ``MLA`` layout as it is, ``[num_pages, page_size, L + R]``: per token
one latent row, its normalised ``c_kv [L]`` then its roped shared key ``k_pe [R]`` (one
KV "head", blocks along dimension 0, pages read through ``page_indices`` as
:func:`~hwplug_tpu.rpa.ragged_paged_attention` reads its pages). :func:`store_latents`
writes a step's rows into it; :func:`mla_attention` attends, in the form the reference
chooses for the batch (:func:`hwplug.kernel_registry.reference.mla.mla_attention`): a
decode batch (``max_q_len`` 1, static) in the **absorbed** form, ``W_UK`` folded into the
queries (``[q_nope W_UK, q_pe]``), every head's query against the latents as one shared
KV head, ``W_UV`` applied to each head's latent output; any other batch (prefill, chunks,
verify steps, mixed) in the **expanded** form, the context's keys ``[W_UK c, k_pe]`` and
values ``W_UV c`` expanded per head. fp32 inside; outputs in ``q_nope``'s dtype.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hwplug_tpu.jax_ops import store_rows
from hwplug_tpu.rpa import HIDDEN, ragged_queries, unpad, visible_keys

_F32 = jnp.float32


def _store_latents(cache: jax.Array, kv_c: jax.Array, k_pe: jax.Array, slots: jax.Array
                   ) -> jax.Array:
    """``cache [num_pages, page_size, L + R]`` with ``[kv_c [T, L], k_pe [T, R]]`` at
    ``slots [T]`` (cast to the cache dtype); a negative slot is skipped."""
    return store_rows(cache, jnp.concatenate((kv_c, k_pe), axis=-1), slots)


#: :func:`_store_latents` returning a new cache.
store_latents = jax.jit(_store_latents)
#: :func:`_store_latents` reusing the cache's buffer (the array passed in is consumed).
store_latents_in_place = jax.jit(_store_latents, donate_argnums=0)


@functools.partial(jax.jit, static_argnames=("sm_scale", "max_q_len"))
def mla_attention(q_nope: jax.Array, cache: jax.Array, kv_lens: jax.Array,
                  page_indices: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array,
                  q_pe: jax.Array, w_uk: jax.Array, w_uv: jax.Array, *, sm_scale: float,
                  max_q_len: int) -> jax.Array:
    """Causal latent attention of ``q_nope [T, H, N]`` and ``q_pe [T, H, R]`` over each
    sequence's cached latents (batch inputs as :func:`~hwplug_tpu.rpa.ragged_paged_attention`'s;
    ``w_uk [H, N, L]``, ``w_uv [H, V, L]``); returns ``[T, H, V]`` (padding rows zero)."""
    num_tokens, kv_lora, dtype = q_nope.shape[0], w_uk.shape[2], q_nope.dtype
    num_slots, pages_per_seq = page_indices.shape
    uk, uv = w_uk.astype(_F32), w_uv.astype(_F32)
    query = jnp.concatenate((q_nope, q_pe), axis=-1)
    q, positions, target = ragged_queries(query, kv_lens, cu_q_lens, num_seqs, max_q_len)
    q_nope, q_pe = q[..., :q_nope.shape[-1]], q[..., q_nope.shape[-1]:]  # [S, Q, H, *]
    latents = cache[page_indices].reshape(num_slots, pages_per_seq * cache.shape[1],
                                          -1).astype(_F32)
    c, k_pe = latents[..., :kv_lora], latents[..., kv_lora:]  # [S, K, L], [S, K, R]
    visible = visible_keys(positions, kv_lens, latents.shape[1])[:, None]  # [S, 1, Q, K]
    rope_scores = jnp.einsum("sqhr,skr->shqk", q_pe, k_pe)
    if max_q_len == 1:  # absorbed: the latents are every head's one key and value
        q_latent = jnp.einsum("sqhn,hnl->sqhl", q_nope, uk)
        scores = jnp.einsum("sqhl,skl->shqk", q_latent, c) + rope_scores
        weights = jax.nn.softmax(jnp.where(visible, scores * sm_scale, HIDDEN), axis=-1)
        out = jnp.einsum("sqhl,hvl->sqhv", jnp.einsum("shqk,skl->sqhl", weights, c), uv)
    else:  # expanded: keys and values of the context per head
        k_nope, values = jnp.einsum("skl,hnl->skhn", c, uk), jnp.einsum("skl,hvl->skhv", c, uv)
        scores = jnp.einsum("sqhn,skhn->shqk", q_nope, k_nope) + rope_scores
        weights = jax.nn.softmax(jnp.where(visible, scores * sm_scale, HIDDEN), axis=-1)
        out = jnp.einsum("shqk,skhv->sqhv", weights, values)
    out = out.reshape(num_slots * max_q_len, *out.shape[2:]).astype(dtype)
    return unpad(out, target, num_tokens)
