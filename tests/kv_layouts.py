"""KV-cache layouts the core tests register as a plugin would (importable as
``kv_layouts``): one that is a view of ``NHD`` and one that is not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from hwplug import registries
from hwplug.discovery import current_platform
from hwplug.kv_cache_layout import KVCacheLayout
from hwplug.registry import current_source


class HeadsFirst(KVCacheLayout):
    """``[2, num_blocks, Hkv, block_size, D]``: a transposed view of ``NHD``."""

    name = "TEST_HND"
    reference_is_view = True

    def shape(self, num_blocks, block_size, num_kv_heads, head_size, dtype=None):
        return (2, num_blocks, num_kv_heads, block_size, head_size)

    def check(self, cache: torch.Tensor) -> str | None:
        return None if cache.dim() == 5 and cache.shape[0] == 2 else "not 5-D"

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        return cache.transpose(2, 3)

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        if reference.data_ptr() != out.data_ptr():
            out.copy_(reference.transpose(2, 3))


class BlocksLast(KVCacheLayout):
    """``[2, block_size, Hkv, D, num_blocks]``: no view of ``NHD``, blocks last."""

    name = "TEST_BLOCKS_LAST"
    block_dim = 4

    def shape(self, num_blocks, block_size, num_kv_heads, head_size, dtype=None):
        return (2, block_size, num_kv_heads, head_size, num_blocks)

    def check(self, cache: torch.Tensor) -> str | None:
        return None if cache.dim() == 5 and cache.shape[0] == 2 else "not 5-D"

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        return cache.permute(0, 4, 1, 2, 3).contiguous()

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(reference.permute(0, 2, 3, 4, 1))


HEADS_FIRST, BLOCKS_LAST = HeadsFirst(), BlocksLast()


@contextmanager
def registered(*layouts: KVCacheLayout) -> Iterator[None]:
    """``layouts`` registered as a plugin's (after discovery), dropped on exit."""
    current_platform()
    token = current_source.set(__name__)
    try:
        for layout in layouts:
            registries.kv_layouts.register(layout.name, layout)
    finally:
        current_source.reset(token)
    try:
        yield
    finally:
        registries.kv_layouts.drop_source(__name__)
