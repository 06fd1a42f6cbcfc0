"""The ``RPA_INTERLEAVED`` KV-cache layout: the ``kv_pages`` JAX's ragged paged attention
reads.

One layer's cache is ``kv_pages [num_blocks, block_size, 2 * Hkv, D]``: KV head ``h``'s
key at head index ``2h``, its value at ``2h + 1``. The same memory, seen as
``[2, num_blocks, block_size, Hkv, D]``, is the reference ``NHD`` cache
(:meth:`InterleavedLayout.to_reference` is a view: writes through it land in the pages),
so the reference ops serve this layout exactly, writes included. Blocks lie along
dimension 0. Registered by the plugin's ``hwplug_register_kv_layouts`` hook; pure torch
(no JAX import), so connectors convert its blocks on any host.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from hwplug.kv_cache_layout import KVCacheLayout


class InterleavedLayout(KVCacheLayout):
    """``[num_blocks, block_size, 2 * Hkv, D]``, K and V interleaved along the heads."""

    name: ClassVar[str] = "RPA_INTERLEAVED"
    reference_is_view: ClassVar[bool] = True
    block_dim: ClassVar[int] = 0

    def shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return (num_blocks, block_size, 2 * num_kv_heads, head_size)

    def check(self, cache: torch.Tensor) -> str | None:
        if cache.dim() != 4 or cache.shape[2] % 2:
            return f"kv_pages must be [num_blocks, block_size, 2 * Hkv, D], got " \
                   f"{tuple(cache.shape)}"
        return None

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        return cache.unflatten(2, (-1, 2)).permute(3, 0, 1, 2, 4)

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        view = self.to_reference(out)
        if (reference.data_ptr(), reference.stride()) != (view.data_ptr(), view.stride()):
            view.copy_(reference)


#: The layout's one instance, registered as ``"RPA_INTERLEAVED"``.
RPA_INTERLEAVED = InterleavedLayout()
