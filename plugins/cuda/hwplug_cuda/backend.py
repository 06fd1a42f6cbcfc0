"""``TRITON_ATTN``: paged attention on NVIDIA GPUs with hwplug-cuda's Triton kernels.

KV layout ``NHD`` (``[2, num_blocks, block_size, Hkv, D]``), the same bytes as the
REFERENCE backend, so blocks move between the two unchanged. The backend writes the
new K/V into the cache inside ``forward``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionBackend, AttentionMetadata, AttentionSpec, InternalFallback
from hwplug_cuda.kernels import MAX_HEAD_SIZE

if TYPE_CHECKING:
    import torch

    from hwplug.platform import Platform


class TritonAttentionBackend(AttentionBackend):
    """Decode: GQA-grouped split-KV kernel. Prefill and mixed batches: a flash-attention
    kernel tiled over the block table. Both in one ``paged_attention`` call."""

    platforms: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    #: Any head size up to ``MAX_HEAD_SIZE`` (checked in :meth:`validate`); any block size
    #: works, these are the ones offered when settling the cache.
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    supports_non_causal: ClassVar[bool] = True
    supports_sliding_window: ClassVar[bool] = True
    supports_soft_cap: ClassVar[bool] = True
    min_capability: ClassVar[str | None] = "8.0"
    kv_cache_layout: ClassVar[str] = "NHD"
    updates_kv_cache_in_forward: ClassVar[bool] = True
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("every query length is 1", "split-KV decode kernel"),
        InternalFallback("any query length > 1", "paged flash-attention prefill kernel"),
    )

    @classmethod
    def get_name(cls) -> str:
        return "TRITON_ATTN"

    @classmethod
    def validate(cls, spec: AttentionSpec, platform: Platform | None = None) -> list[str]:
        reasons = super().validate(spec, platform)
        if spec.head_size > MAX_HEAD_SIZE:
            reasons.append(f"head size {spec.head_size} above {MAX_HEAD_SIZE}")
        return reasons

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> None:
        from hwplug_cuda.kernels.cache import reshape_and_cache

        reshape_and_cache(key, value, kv_cache, metadata.slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        from hwplug_cuda.kernels.attention import paged_attention

        self.write_kv_cache(key, value, kv_cache, metadata)
        spec = self.spec
        return paged_attention(
            query, kv_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, scale, spec.causal, spec.sliding_window, spec.soft_cap,
            metadata.max_query_len, metadata.max_seq_len)
