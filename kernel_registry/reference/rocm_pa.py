"""The ``ROCM_PA`` KV-cache layout (the one ROCm's paged-attention kernels read) and its
pure-torch references, which convert to ``NHD`` and call the ``NHD`` references.

One layer's cache is one tensor ``kv_cache [2, num_blocks, Hkv, D, block_size]``:

* ``kv_cache[1]``, the values, is exactly ``[num_blocks, Hkv, D, block_size]``;
* ``kv_cache[0]``, the keys, holds the same number of elements per (block, head) ordered
  ``[D // x, block_size, x]`` with ``x = 16 bytes // element size`` (8 for bf16/fp16, 4
  for fp32, 16 for fp8): each key's head dimension is split into 16-byte chunks, and a
  chunk of every slot of the block lies next to the same chunk of the other slots.
  :func:`key_view` gives it as ``[num_blocks, Hkv, D // x, block_size, x]``, the shape
  ROCm's and AITER's paged attention take.

The declared shape carries no ``x``, so it does not depend on the cache dtype
(``AttentionBackend.kv_cache_shape`` is not told the dtype); ``D`` must be a multiple of
``x``. Conversions are exact permutations (fp8 caches included).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.attention import paged_attention as nhd_paged_attention
from hwplug.kernel_registry.reference.cache import reshape_and_cache as nhd_reshape_and_cache
from hwplug.kv_cache_layout import NHD

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: Layout name, as backends state it in ``kv_cache_layout``.
LAYOUT = "ROCM_PA"
#: Bytes of one key chunk.
CHUNK_BYTES = 16


def chunk_elements(dtype: torch.dtype) -> int:
    """``x``: elements of ``dtype`` in one 16-byte key chunk."""
    return CHUNK_BYTES // dtype.itemsize


def cache_shape(num_blocks: int, block_size: int, num_kv_heads: int,
                head_size: int) -> tuple[int, ...]:
    """Shape of one layer's ``ROCM_PA`` cache: ``[2, num_blocks, Hkv, D, block_size]``."""
    return (2, num_blocks, num_kv_heads, head_size, block_size)


def check_cache(kv_cache: torch.Tensor) -> str | None:
    """Why ``kv_cache`` is not a ``ROCM_PA`` cache, or None."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return f"kv_cache must be [2, num_blocks, Hkv, D, block_size], got {tuple(kv_cache.shape)}"
    x = chunk_elements(kv_cache.dtype)
    if kv_cache.shape[3] % x:
        return f"head size {kv_cache.shape[3]} is not a multiple of x = {x} ({kv_cache.dtype})"
    if not kv_cache.is_contiguous():
        return "kv_cache must be contiguous"
    return None


def key_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The keys of a ``ROCM_PA`` cache as ``[num_blocks, Hkv, D // x, block_size, x]``."""
    _, num_blocks, num_kv_heads, head_size, block_size = kv_cache.shape
    x = chunk_elements(kv_cache.dtype)
    return kv_cache[0].view(num_blocks, num_kv_heads, head_size // x, block_size, x)


def to_nhd(kv_cache: torch.Tensor) -> torch.Tensor:
    """A new ``NHD`` cache ``[2, num_blocks, block_size, Hkv, D]`` holding the same entries.

    Raises :class:`~hwplug.errors.UnsupportedError` when ``kv_cache`` is not ``ROCM_PA``."""
    reason = check_cache(kv_cache)
    if reason:
        raise UnsupportedError(reason)
    _, num_blocks, num_kv_heads, head_size, block_size = kv_cache.shape
    keys = key_view(kv_cache).permute(0, 3, 1, 2, 4).reshape(
        num_blocks, block_size, num_kv_heads, head_size)
    return torch.stack((keys, kv_cache[1].permute(0, 3, 1, 2)))


def from_nhd(nhd: torch.Tensor, out: torch.Tensor) -> None:
    """Write the ``NHD`` cache ``nhd`` into the ``ROCM_PA`` cache ``out`` of the same
    geometry and dtype (the inverse of :func:`to_nhd`)."""
    _, num_blocks, num_kv_heads, head_size, block_size = out.shape
    x = chunk_elements(out.dtype)
    keys = nhd[0].reshape(num_blocks, block_size, num_kv_heads, head_size // x, x)
    key_view(out).copy_(keys.permute(0, 2, 3, 1, 4))
    out[1].copy_(nhd[1].permute(0, 2, 3, 1))


def reshape_and_cache_rocm_pa(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                              slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """``reshape_and_cache`` into a ``ROCM_PA`` cache: the ``NHD`` reference on a converted
    copy, written back (in place; a negative slot is skipped)."""
    nhd = to_nhd(kv_cache)
    nhd_reshape_and_cache(key, value, nhd, slot_mapping, replace(params, layout=NHD))
    from_nhd(nhd, kv_cache)


def paged_attention_rocm_pa(query: torch.Tensor, kv_cache: torch.Tensor,
                            metadata: AttentionMetadata, params: PagedAttentionParams
                            ) -> torch.Tensor:
    """``paged_attention`` over a ``ROCM_PA`` cache: the ``NHD`` reference on a converted copy."""
    return nhd_paged_attention(query, to_nhd(kv_cache), metadata, replace(params, layout=NHD))
