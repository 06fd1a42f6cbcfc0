"""``TORCH_PAGED``: the paged attention backend built from the registry's ops.

It runs on every platform: its two ops, ``reshape_and_cache`` and ``paged_attention``,
dispatch to the platform's best variants (the pure-torch references where nothing
better is registered), so it serves every mask the ``paged_attention`` op defines. It is
the oracle the conformance kit compares other backends against, and a base for
backends that only add facts about which variants must serve them (hwplug-triton's
``TRITON_ATTN`` family). KV layout ``NHD``: one layer's cache is ``[2, num_blocks,
block_size, Hkv, D]``; a backend of another layout names the pair of ops that layout has
(``_cache_op``, ``_attention_op``, with the same arguments) and its ``kv_cache_shape``.
Registered also under its old name ``REFERENCE``, a deprecated alias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionBackend, AttentionMetadata, AttentionSpec
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES
from hwplug.kernel_registry import kernels

if TYPE_CHECKING:
    import torch


class TorchPagedBackend(AttentionBackend):
    """Writes K/V with ``ops.reshape_and_cache``, then attends with ``ops.paged_attention``."""

    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    #: fp8 caches are read with this layer's k/v scales (``k_scale`` / ``v_scale``).
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *FP8_KV_DTYPES)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256)
    supports_non_causal: ClassVar[bool] = True
    supports_sliding_window: ClassVar[bool] = True
    supports_soft_cap: ClassVar[bool] = True
    kv_cache_layout: ClassVar[str] = "NHD"
    updates_kv_cache_in_forward: ClassVar[bool] = True
    #: The ops that write and read the cache in this layout (the registry's op names).
    _cache_op: ClassVar[str] = "reshape_and_cache"
    _attention_op: ClassVar[str] = "paged_attention"

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self._write, self._attend = kernels.op(self._cache_op), kernels.op(self._attention_op)

    @classmethod
    def get_name(cls) -> str:
        return "TORCH_PAGED"

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> None:
        self._write(key, value, kv_cache, metadata.slot_mapping, self.k_scale, self.v_scale)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        self.write_kv_cache(key, value, kv_cache, metadata)
        spec = self.spec
        return self._attend(
            query, kv_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, scale, spec.causal, spec.sliding_window,
            spec.soft_cap, metadata.max_query_len, metadata.max_seq_len, self.k_scale,
            self.v_scale)
