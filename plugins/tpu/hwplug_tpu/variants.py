"""hwplug-tpu's kernel variants: each op of the registry as a jitted JAX function.

A variant takes and returns what the op's reference does (torch tensors, see
:mod:`hwplug.kernel_registry.ops`; the cache ops' variants serve the ``RPA_INTERLEAVED``
layout): it hands its inputs to JAX through
:mod:`hwplug_tpu.bridge` with the token dimension padded to a bucket, calls the jitted
function of :mod:`hwplug_tpu.jax_ops` or :mod:`hwplug_tpu.rpa`, and gives back the rows
of the real tokens. Attention pads its batch (sequences, query length, block-table
width) to buckets too, so a decode step of a given bucket compiles once, not per step.
``*_supported`` functions are the per-call ``supports`` checks: an fp8 KV cache (k/v
scales), non-causal attention or an unknown GELU form is declined, and the registry
falls back to the next variant (the reference).

While a step is recorded (:func:`hwplug_tpu.step.recording`), a variant computes nothing:
it records its JAX function on the step's exact shapes (the step is compiled per bucket
as a whole) and returns placeholders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import torch

from hwplug_tpu import jax_ops, rpa
from hwplug_tpu.bridge import bucket, is_cache, padded, replace_cache, to_jax, to_torch
from hwplug_tpu.step import recording

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: KV-cache dtypes the JAX cache write and attention store and read.
KV_DTYPES = (torch.float32, torch.bfloat16)


def bucket_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x [..., H]`` as ``[N, H]`` padded to N's bucket, and N."""
    flat = x.reshape(-1, x.shape[-1])
    return padded(flat, bucket(flat.shape[0])), flat.shape[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if (rec := recording()) is not None:
        return (rec.call(jax_ops.rms_norm, x, weight, eps=eps) if residual is None else
                rec.call(jax_ops.add_rms_norm, x, residual, weight, eps=eps))
    rows, n = bucket_rows(x)
    if residual is None:
        return to_torch(jax_ops.rms_norm(to_jax(rows), to_jax(weight), eps))[:n].view(x.shape)
    normed, summed = jax_ops.add_rms_norm(to_jax(rows), to_jax(bucket_rows(residual)[0]),
                                          to_jax(weight), eps)
    return to_torch(normed)[:n].view(x.shape), to_torch(summed)[:n].view(x.shape)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    if (rec := recording()) is not None:
        return rec.call(jax_ops.rotary_embedding, positions, query, key, cos_sin_cache,
                        is_neox=is_neox)
    n = positions.shape[0]
    size = bucket(n)
    q, k = jax_ops.rotary_embedding(to_jax(padded(positions, size)),
                                    to_jax(padded(query, size)), to_jax(padded(key, size)),
                                    to_jax(cos_sin_cache), is_neox)
    return to_torch(q)[:n], to_torch(k)[:n]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if (rec := recording()) is not None:
        return rec.call(jax_ops.silu_and_mul, x)
    rows, n = bucket_rows(x)
    return to_torch(jax_ops.silu_and_mul(to_jax(rows)))[:n].view(*x.shape[:-1], -1)


def gelu_and_mul(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    if (rec := recording()) is not None:
        return rec.call(jax_ops.gelu_and_mul, x, approximate=approximate)
    rows, n = bucket_rows(x)
    out = jax_ops.gelu_and_mul(to_jax(rows), approximate)
    return to_torch(out)[:n].view(*x.shape[:-1], -1)


def gelu_supported(x: torch.Tensor, approximate: str = "none") -> str | None:
    return None if approximate in ("none", "tanh") else (
        f"approximate={approximate!r} is neither 'none' nor 'tanh'")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    if (rec := recording()) is not None:
        return rec.call(jax_ops.linear, x, weight, bias)
    rows, n = bucket_rows(x)
    out = jax_ops.linear(to_jax(rows), to_jax(weight), None if bias is None else to_jax(bias))
    return to_torch(out)[:n].view(*x.shape[:-1], -1)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if (rec := recording()) is not None:
        return rec.call(jax_ops.embedding, ids, weight)
    n = ids.shape[0]
    return to_torch(jax_ops.embedding(to_jax(padded(ids, bucket(n))), to_jax(weight)))[:n]


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_pages: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache`` op into an ``RPA_INTERLEAVED`` cache ``kv_pages
    [num_blocks, block_size, 2 * Hkv, D]``, in JAX: a cache the engine placed on the device
    is replaced there by the written one (its buffer reused); any other is written back
    into ``kv_pages``."""
    if (rec := recording()) is not None:
        return rec.update(kv_pages, jax_ops.store_kv, key, value, slot_mapping)
    size = bucket(key.shape[0])
    rows = (to_jax(padded(key, size)), to_jax(padded(value, size)),
            to_jax(padded(slot_mapping, size, -1)))
    if is_cache(kv_pages):
        replace_cache(kv_pages, jax_ops.store_kv_in_place(to_jax(kv_pages), *rows))
    else:
        kv_pages.copy_(to_torch(jax_ops.store_kv(to_jax(kv_pages), *rows)))
    return None


def cache_supported(key: torch.Tensor, value: torch.Tensor, kv_pages: torch.Tensor,
                    slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why the cache write declines a call (an fp8 cache), or None."""
    return _kv_reason(kv_pages, params)


def kv_reason(kv_pages: torch.Tensor, scales: str | None) -> str | None:
    """Why the JAX ops decline a KV cache: not float32 or bfloat16, or given ``scales``
    (their name: an fp8 cache's); None when they read and write it."""
    if kv_pages.dtype not in KV_DTYPES:
        return f"KV cache {kv_pages.dtype} is not float32 or bfloat16"
    if scales is not None:
        return f"{scales} given (an fp8 KV cache): not supported"
    return None


def _kv_reason(kv_pages: torch.Tensor, params: PagedAttentionParams) -> str | None:
    scaled = params.k_scale is not None or params.v_scale is not None
    return kv_reason(kv_pages, "k/v scales" if scaled else None)


def _attention_variant(kernel: Callable[..., jax.Array]) -> Callable[..., torch.Tensor]:
    """The ``paged_attention`` variant (layout ``RPA_INTERLEAVED``) that runs ``kernel`` (a
    function of :mod:`hwplug_tpu.rpa`) on the batch padded to buckets."""

    def attention(query: torch.Tensor, kv_pages: torch.Tensor, metadata: AttentionMetadata,
                  params: PagedAttentionParams) -> torch.Tensor:
        if (rec := recording()) is not None:  # every sequence of the step is real
            return rec.call(every_sequence, query, kv_pages, metadata.seq_lens,
                            metadata.block_tables, metadata.query_start_loc, kernel=kernel,
                            sm_scale=params.scale, sliding_window=params.sliding_window,
                            soft_cap=params.soft_cap, max_q_len=bucket(metadata.max_query_len))
        if query.shape[0] == 0 or metadata.seq_lens.shape[0] == 0:
            return query.new_empty(query.shape)
        out = kernel(to_jax(padded(query, bucket(query.shape[0]))), to_jax(kv_pages),
                     *padded_batch(metadata), sm_scale=params.scale,
                     sliding_window=params.sliding_window, soft_cap=params.soft_cap,
                     max_q_len=bucket(metadata.max_query_len))
        return to_torch(out)[:query.shape[0]]

    attention.__doc__ = f"``{kernel.__name__}`` on the interleaved cache."
    return attention


def padded_batch(metadata: AttentionMetadata) -> tuple[jax.Array, ...]:
    """The ragged kernels' batch inputs of ``metadata`` on the device, padded to buckets:
    ``kv_lens [S']``, ``page_indices [S', W']`` (missing blocks read block 0),
    ``cu_q_lens [S' + 1]`` and ``num_seqs [1]`` (``S'``, ``W'``: the buckets of the
    sequences and of the block-table width)."""
    seq_lens, block_tables = metadata.seq_lens, metadata.block_tables
    query_start_loc, num_seqs = metadata.query_start_loc, seq_lens.shape[0]
    seqs, width = bucket(num_seqs), bucket(block_tables.shape[1])
    tables = block_tables.new_zeros((seqs, width))
    tables[:num_seqs, :block_tables.shape[1]] = block_tables.clamp(min=0)
    return (to_jax(padded(seq_lens, seqs)), to_jax(tables),
            to_jax(padded(query_start_loc, seqs + 1, int(query_start_loc[-1]))),
            to_jax(torch.tensor([num_seqs], dtype=torch.int32)))


def every_sequence(queries: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array,
                   page_indices: jax.Array, cu_q_lens: jax.Array, *extra: jax.Array,
                   kernel: Callable[..., jax.Array], **options: object) -> jax.Array:
    """``kernel`` over a batch whose every sequence is real (a recorded step's); ``extra``
    follow the batch inputs."""
    num_seqs = jnp.full((1,), kv_lens.shape[0], jnp.int32)
    return kernel(queries, kv_pages, kv_lens, jnp.maximum(page_indices, 0), cu_q_lens,
                  num_seqs, *extra, **options)


#: The pure-JAX ragged paged attention, for any JAX backend.
paged_attention = _attention_variant(rpa.ragged_paged_attention)
#: JAX's Pallas TPU kernel.
pallas_paged_attention = _attention_variant(rpa.pallas_ragged_paged_attention)


def attention_supported(query: torch.Tensor, kv_pages: torch.Tensor, metadata: AttentionMetadata,
                        params: PagedAttentionParams) -> str | None:
    """Why the attention variants decline a call (non-causal, an fp8 cache), or None."""
    if not params.causal:
        return "ragged paged attention is causal only"
    return _kv_reason(kv_pages, params)
