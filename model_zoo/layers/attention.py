"""``Attention``: one model layer's paged attention, served by the context's backend."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.attention import AttentionMetadata, AttentionSpec

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext


class Attention(nn.Module):
    """Attention of ``num_heads`` query heads over ``num_kv_heads`` cached K/V heads.

    The backend instance (``ctx.attention_backend``) is built once, for a spec taken from
    ``ctx.engine_config`` (dtype, KV-cache dtype, block size, causal, soft cap) with this layer's
    geometry and ``sliding_window``. ``forward(query, key, value, kv_cache, metadata)``
    takes ``query [T, Hq * D]`` (or ``[T, Hq, D]``), ``key``/``value [T, Hkv * D]`` (or
    ``[T, Hkv, D]``), this layer's ``kv_cache`` and the batch's metadata, and returns
    ``[T, Hq * D]``. The new K/V are stored by the backend's forward when it
    ``updates_kv_cache_in_forward``, else by ``backend.write_kv_cache`` just before it.
    """

    def __init__(self, ctx: ModelContext, num_heads: int, num_kv_heads: int, head_size: int,
                 *, scale: float | None = None, sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.scale = head_size ** -0.5 if scale is None else scale
        spec = replace(AttentionSpec.from_config(ctx.engine_config), num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_size=head_size,
                       sliding_window=sliding_window)
        self.backend = ctx.attention_backend(spec)
        self.writes_cache_first = not self.backend.updates_kv_cache_in_forward

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        query = query.view(-1, self.num_heads, self.head_size)
        key = key.view(-1, self.num_kv_heads, self.head_size)
        value = value.view(-1, self.num_kv_heads, self.head_size)
        if self.writes_cache_first:
            self.backend.write_kv_cache(key, value, kv_cache, metadata)
        out = self.backend.forward(query, key, value, kv_cache, metadata, self.scale)
        return out.reshape(-1, self.num_heads * self.head_size)
