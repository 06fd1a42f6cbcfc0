"""hwplug-tpu's multi-head latent attention variants: ``concat_and_cache_mla`` and
``mla_attention`` over the ``MLA`` latent cache as the jitted JAX functions of
:mod:`hwplug_tpu.mla` (prefill expanded, decode absorbed), batches padded to buckets as
the ``paged_attention`` variants pad theirs (:func:`hwplug_tpu.variants.padded_batch`).

A cache the engine placed on the JAX device is written there (its buffer reused); any
other is written back into the torch tensor. An fp8 latent cache (a ``kv_scale``) or a
dtype other than float32/bfloat16 is declined (the references serve it), as is a call
whose shapes do not fill the cache (the reference then raises, naming them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug_tpu import mla
from hwplug_tpu.bridge import bucket, is_cache, padded, replace_cache, to_jax, to_torch
from hwplug_tpu.step import recording
from hwplug_tpu.variants import every_sequence, kv_reason, padded_batch

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata


def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None
                         ) -> None:
    """The ``concat_and_cache_mla`` op in JAX (no ``kv_scale``: see
    :func:`cache_supported`)."""
    if (rec := recording()) is not None:
        return rec.update(kv_cache, mla.store_latents, kv_c, k_pe, slot_mapping)
    size = bucket(kv_c.shape[0])
    rows = (to_jax(padded(kv_c, size)), to_jax(padded(k_pe, size)),
            to_jax(padded(slot_mapping, size, -1)))
    if is_cache(kv_cache):
        replace_cache(kv_cache, mla.store_latents_in_place(to_jax(kv_cache), *rows))
    else:
        kv_cache.copy_(to_torch(mla.store_latents(to_jax(kv_cache), *rows)))
    return None


def cache_supported(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None
                    ) -> str | None:
    """Why the latent cache write declines a call (an fp8 cache, shapes that do not fill
    the cache), or None."""
    if kv_cache.dim() != 3 or kv_c.shape[-1] + k_pe.shape[-1] != kv_cache.shape[-1]:
        return (f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} do not fill an MLA "
                f"cache {tuple(kv_cache.shape)}")
    return kv_reason(kv_cache, None if kv_scale is None else "a kv_scale")


def mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                  metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                  scale: float, kv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The ``mla_attention`` op in JAX: ``[T, H, V]`` in ``q_nope.dtype``; the absorbed
    form for a decode batch, the expanded form for any other."""
    options = dict(kernel=mla.mla_attention, sm_scale=float(scale),
                   max_q_len=bucket(metadata.max_query_len))
    if (rec := recording()) is not None:  # every sequence of the step is real
        return rec.call(every_sequence, q_nope, kv_cache, metadata.seq_lens,
                        metadata.block_tables, metadata.query_start_loc, q_pe, w_uk, w_uv,
                        **options)
    num_tokens = q_nope.shape[0]
    if num_tokens == 0 or metadata.seq_lens.shape[0] == 0:
        return q_nope.new_zeros((num_tokens, q_nope.shape[1], w_uv.shape[1]))
    size = bucket(num_tokens)
    kernel = options.pop("kernel")
    out = kernel(to_jax(padded(q_nope, size)), to_jax(kv_cache), *padded_batch(metadata),
                 to_jax(padded(q_pe, size)), to_jax(w_uk), to_jax(w_uv), **options)
    return to_torch(out)[:num_tokens]


def attention_supported(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor,
                        metadata: AttentionMetadata, w_uk: torch.Tensor, w_uv: torch.Tensor,
                        scale: float, kv_scale: torch.Tensor | None = None) -> str | None:
    """Why the latent attention declines a call (an fp8 cache), or None."""
    return kv_reason(kv_cache, None if kv_scale is None else "a kv_scale")
