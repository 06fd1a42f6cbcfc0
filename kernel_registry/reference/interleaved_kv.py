"""References of the interleaved paged KV layout: the ``NHD`` references, through a view.

One layer's cache is ``kv_pages [num_blocks, block_size, 2 * Hkv, D]``: KV head ``h``'s
key at head index ``2h``, its value at ``2h + 1`` (the layout JAX's ragged paged
attention reads). :func:`nhd_view` shows the same memory as the ``NHD`` cache
``[2, num_blocks, block_size, Hkv, D]``, so the ``reshape_and_cache`` and
``paged_attention`` references define these ops exactly, writes included.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from hwplug.kernel_registry.reference.attention import paged_attention
from hwplug.kernel_registry.reference.cache import reshape_and_cache
from hwplug.kv_cache_layout import NHD

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams


def nhd_view(kv_pages: torch.Tensor) -> torch.Tensor:
    """``kv_pages [num_blocks, block_size, 2 * Hkv, D]`` as ``[2, num_blocks, block_size,
    Hkv, D]`` (keys, then values), sharing its memory: writes go through."""
    return kv_pages.unflatten(2, (-1, 2)).permute(3, 0, 1, 2, 4)


def reshape_and_cache_interleaved(key: torch.Tensor, value: torch.Tensor,
                                  kv_pages: torch.Tensor, slot_mapping: torch.Tensor,
                                  params: PagedAttentionParams) -> None:
    """``reshape_and_cache`` into ``kv_pages`` in place."""
    reshape_and_cache(key, value, nhd_view(kv_pages), slot_mapping, replace(params, layout=NHD))


def paged_attention_interleaved(query: torch.Tensor, kv_pages: torch.Tensor,
                                metadata: AttentionMetadata, params: PagedAttentionParams
                                ) -> torch.Tensor:
    """``paged_attention`` of ``query [T, Hq, D]`` over ``kv_pages``."""
    return paged_attention(query, nhd_view(kv_pages), metadata, replace(params, layout=NHD))
