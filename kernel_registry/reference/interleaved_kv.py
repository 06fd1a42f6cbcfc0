"""References of the interleaved paged KV layout: the ``NHD`` references, through a view.

One layer's cache is ``kv_pages [num_blocks, block_size, 2 * Hkv, D]``: KV head ``h``'s
key at head index ``2h``, its value at ``2h + 1`` (the layout JAX's ragged paged
attention reads). :func:`nhd_view` shows the same memory as the ``NHD`` cache
``[2, num_blocks, block_size, Hkv, D]``, so the ``reshape_and_cache`` and
``paged_attention`` references define these ops exactly, writes included.
"""

from __future__ import annotations

from typing import Any

import torch

from hwplug.kernel_registry.reference.attention import paged_attention
from hwplug.kernel_registry.reference.cache import reshape_and_cache


def nhd_view(kv_pages: torch.Tensor) -> torch.Tensor:
    """``kv_pages [num_blocks, block_size, 2 * Hkv, D]`` as ``[2, num_blocks, block_size,
    Hkv, D]`` (keys, then values), sharing its memory: writes go through."""
    return kv_pages.unflatten(2, (-1, 2)).permute(3, 0, 1, 2, 4)


def reshape_and_cache_interleaved(key: torch.Tensor, value: torch.Tensor,
                                  kv_pages: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``reshape_and_cache`` into ``kv_pages`` in place; the other arguments (slot mapping,
    k/v scales) as that op takes them."""
    reshape_and_cache(key, value, nhd_view(kv_pages), *args, **kwargs)


def paged_attention_interleaved(query: torch.Tensor, kv_pages: torch.Tensor, *args: Any,
                                **kwargs: Any) -> torch.Tensor:
    """``paged_attention`` of ``query [T, Hq, D]`` over ``kv_pages``; the other arguments
    (block tables, lengths, scale, masks, k/v scales) as that op takes them."""
    return paged_attention(query, nhd_view(kv_pages), *args, **kwargs)
