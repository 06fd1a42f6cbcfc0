"""``ACME_NPU_ATTN``: the attention backend of hwplug-acme-npu.

Its eligibility is declared as class attributes (dtypes, head and block sizes, masks,
KV layout), so hwplug can explain every accept and reject. The template delegates to
hwplug's ops over the ``NHD`` layout; replace ``write_kv_cache`` and ``forward`` (and
``kv_cache_shape`` and ``kv_cache_layout`` if your kernels use another layout) with your
kernels. The conformance kit runs prefill, chunked prefill,
decode, GQA, sliding-window and soft-cap batches through it against the reference.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from hwplug import ops
from hwplug.attention import AttentionBackend, AttentionMetadata


class AcmeNpuAttentionBackend(AttentionBackend):
    """Paged attention for acme-npu devices (reference ops until you plug in kernels)."""

    platforms: ClassVar[tuple[str, ...]] = ("acme-npu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32)
    supports_sliding_window: ClassVar[bool] = True
    supports_soft_cap: ClassVar[bool] = True
    kv_cache_layout: ClassVar[str] = "NHD"
    #: The engine calls write_kv_cache before forward.
    updates_kv_cache_in_forward: ClassVar[bool] = False

    @classmethod
    def get_name(cls) -> str:
        return "ACME_NPU_ATTN"

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> None:
        ops.reshape_and_cache(key, value, kv_cache, metadata.slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        spec = self.spec
        return ops.paged_attention.reference(
            query, kv_cache, metadata.block_tables, metadata.seq_lens,
            metadata.query_start_loc, scale, spec.causal, spec.sliding_window, spec.soft_cap,
            metadata.max_query_len, metadata.max_seq_len)
