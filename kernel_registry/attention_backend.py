"""``REFERENCE``: the paged attention backend built from the registry's ops.

It runs on every platform (its ops dispatch to the platform's best variants, falling
back to the pure-torch references), serves every mask the ``paged_attention`` op
defines, and is the oracle the conformance kit compares other backends against.
KV layout ``NHD``: one layer's cache is ``[2, num_blocks, block_size, Hkv, D]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionBackend, AttentionMetadata
from hwplug.kernel_registry import ops
from hwplug.platform import FLOAT_DTYPES

if TYPE_CHECKING:
    import torch


class ReferenceBackend(AttentionBackend):
    """Writes K/V with ``reshape_and_cache``, then attends with ``paged_attention``."""

    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256)
    supports_non_causal: ClassVar[bool] = True
    supports_sliding_window: ClassVar[bool] = True
    supports_soft_cap: ClassVar[bool] = True
    kv_cache_layout: ClassVar[str] = "NHD"
    updates_kv_cache_in_forward: ClassVar[bool] = True

    @classmethod
    def get_name(cls) -> str:
        return "REFERENCE"

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        self.write_kv_cache(key, value, kv_cache, metadata)
        spec = self.spec
        return ops.paged_attention(
            query, kv_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, scale, spec.causal, spec.sliding_window,
            spec.soft_cap, metadata.max_query_len, metadata.max_seq_len)
