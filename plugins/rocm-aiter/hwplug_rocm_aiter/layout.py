"""The ``ROCM_PA`` KV-cache layout: the one ROCm's (and AITER's) paged attention reads.

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
``x``. Blocks lie along dimension 1, so a selection of blocks is again a ``ROCM_PA``
cache. Conversions with ``NHD`` are exact permutations (fp8 caches included).
Registered by the plugin's ``hwplug_register_kv_layouts`` hook; imports only torch.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from hwplug.kv_cache_layout import KVCacheLayout

#: Bytes of one key chunk.
CHUNK_BYTES = 16


def chunk_elements(dtype: torch.dtype) -> int:
    """``x``: elements of ``dtype`` in one 16-byte key chunk."""
    return CHUNK_BYTES // dtype.itemsize


def key_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The keys of a ``ROCM_PA`` cache as ``[num_blocks, Hkv, D // x, block_size, x]``."""
    _, num_blocks, num_kv_heads, head_size, block_size = kv_cache.shape
    x = chunk_elements(kv_cache.dtype)
    return kv_cache[0].view(num_blocks, num_kv_heads, head_size // x, block_size, x)


class RocmPagedLayout(KVCacheLayout):
    """``[2, num_blocks, Hkv, D, block_size]`` with keys in 16-byte chunks (see the module
    docstring)."""

    name: ClassVar[str] = "ROCM_PA"
    reference_is_view: ClassVar[bool] = False
    block_dim: ClassVar[int] = 1

    def shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return (2, num_blocks, num_kv_heads, head_size, block_size)

    def check(self, cache: torch.Tensor) -> str | None:
        if cache.dim() != 5 or cache.shape[0] != 2:
            return f"kv_cache must be [2, num_blocks, Hkv, D, block_size], got " \
                   f"{tuple(cache.shape)}"
        x = chunk_elements(cache.dtype)
        if cache.shape[3] % x:
            return f"head size {cache.shape[3]} is not a multiple of x = {x} ({cache.dtype})"
        if not cache.is_contiguous():
            return "kv_cache must be contiguous"
        return None

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        _, num_blocks, num_kv_heads, head_size, block_size = cache.shape
        keys = key_view(cache).permute(0, 3, 1, 2, 4).reshape(
            num_blocks, block_size, num_kv_heads, head_size)
        return torch.stack((keys, cache[1].permute(0, 3, 1, 2)))

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        _, num_blocks, num_kv_heads, head_size, block_size = out.shape
        x = chunk_elements(out.dtype)
        keys = reference[0].reshape(num_blocks, block_size, num_kv_heads, head_size // x, x)
        key_view(out).copy_(keys.permute(0, 2, 3, 1, 4))
        out[1].copy_(reference[1].permute(0, 2, 3, 1))


#: The layout's one instance, registered as ``"ROCM_PA"``.
ROCM_PA = RocmPagedLayout()
