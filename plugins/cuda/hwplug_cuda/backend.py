"""``TRITON_ATTN``: paged attention on NVIDIA GPUs served by hwplug-triton's kernels, and
``TRITON_MLA``: multi-head latent attention (DeepSeek) by the same library's MLA kernels.

It computes like ``TORCH_PAGED`` (the registry's ``reshape_and_cache`` and
``paged_attention`` ops, layout ``NHD``, the same bytes, so blocks move between the two
unchanged) and adds facts: it serves a spec only where the registry would choose the
``triton`` variant of both ops for it (see :mod:`hwplug_triton.backend`), so
``HWPLUG_DISABLED_KERNELS=triton`` or a preference for another variant shows up as a
rejection reason, not as a silent change of kernels. The new K/V are written inside
``forward``; fp8 caches are read with the layer's k/v scales. ``TRITON_MLA`` likewise
serves an MLA spec only where the registry chooses the ``triton`` variants of
``concat_and_cache_mla`` and ``mla_attention`` (see :class:`VariantBackedMLA`).
"""

from __future__ import annotations

from typing import ClassVar

from hwplug.attention import InternalFallback
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES
from hwplug_triton.backend import VariantBackedAttention, VariantBackedMLA


class TritonAttentionBackend(VariantBackedAttention):
    """Decode: GQA-grouped split-KV kernel. Prefill and mixed batches: a flash-attention
    kernel tiled over the block table. Both behind the one ``paged_attention`` op."""

    platforms: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *FP8_KV_DTYPES)
    #: Any head size up to 256 (checked in ``validate``); any block size works, these are
    #: the ones offered when settling the cache.
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    min_capability: ClassVar[str | None] = "8.0"
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("every query length is 1", "split-KV decode kernel"),
        InternalFallback("any query length > 1", "paged flash-attention prefill kernel"),
    )

    @classmethod
    def get_name(cls) -> str:
        return "TRITON_ATTN"


class TritonMLABackend(VariantBackedMLA):
    """hwplug-triton's latent cache write and absorbed-form latent attention kernels."""

    platforms: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *FP8_KV_DTYPES)
    min_capability: ClassVar[str | None] = "8.0"

    @classmethod
    def get_name(cls) -> str:
        return "TRITON_MLA"
