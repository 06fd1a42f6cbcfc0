"""hwplug-rocm-aiter's attention backends, both over the ``ROCM_PA`` KV layout (the one
ROCm's paged attention reads, see :mod:`hwplug_rocm_aiter.layout`), through the registry's
``reshape_and_cache`` and ``paged_attention`` ops, whose variants for that layout this
plugin registers:

* ``ROCM_AITER``: decode through AMD's AITER library (the ``aiter`` variant of
  ``paged_attention``); everything AITER does not serve falls back, per call, to
  hwplug-triton's kernel over the same cache (its internal fallbacks, stated as data).
  It serves only where the registry chooses ``aiter``, so without the ``amd-aiter``
  package its rejection reason says so and ``ROCM_TRITON`` serves.
* ``ROCM_TRITON``: hwplug-triton's kernels for both ops (``triton_rocm_pa``), fp8 caches
  included.

Both write the step's K/V inside ``forward``. ``ROCM_TRITON_MLA`` serves multi-head latent
attention (DeepSeek) over the ``MLA`` latent cache with hwplug-triton's MLA kernels
(``triton_rocm``), before ``TORCH_MLA``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionSpec, InternalFallback
from hwplug.dtypes import FLOAT_DTYPES, FNUZ_DTYPES, FP8_KV_DTYPES, torch_dtype
from hwplug_rocm_aiter.aiter_attention import AITER_BLOCK_SIZES, AITER_HEAD_SIZES
from hwplug_rocm_aiter.layout import ROCM_PA, chunk_elements
from hwplug_triton.backend import VariantBackedAttention, VariantBackedMLA

if TYPE_CHECKING:

    from hwplug.platform_interface import Platform

_TRITON = "paged_attention/triton_rocm_pa"


class _RocmPagedAttention(VariantBackedAttention):
    """A ``ROCM_PA`` cache written with ``reshape_and_cache`` and read with
    ``paged_attention``; the head size must be whole 16-byte chunks."""

    platforms: ClassVar[tuple[str, ...]] = ("rocm",)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    kv_cache_layout: ClassVar[str] = ROCM_PA.name
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (
        ("reshape_and_cache", "triton_rocm_pa"), ("paged_attention", "triton_rocm_pa"))

    @classmethod
    def validate(cls, spec: AttentionSpec, platform: Platform | None = None) -> list[str]:
        reasons = super().validate(spec, platform)
        kv_dtype = spec.kv_cache_dtype or spec.dtype
        if kv_dtype in cls.supported_kv_cache_dtypes:
            chunk = chunk_elements(torch_dtype(kv_dtype))
            if spec.head_size % chunk:
                reasons.append(f"head size {spec.head_size} is not a multiple of {chunk} "
                               f"(16-byte key chunks of {kv_dtype})")
        return reasons


class RocmTritonBackend(_RocmPagedAttention):
    """hwplug-triton's split-KV decode and paged flash-attention prefill kernels."""

    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (
        *FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES)
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("every query length is 1", "split-KV decode kernel"),
        InternalFallback("any query length > 1", "paged flash-attention prefill kernel"),
    )

    @classmethod
    def get_name(cls) -> str:
        return "ROCM_TRITON"


class AiterAttentionBackend(_RocmPagedAttention):
    """AITER's paged-attention decode, hwplug-triton's kernels for the rest."""

    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("decode batch, head size in "
                         f"{', '.join(map(str, AITER_HEAD_SIZES))}, block size in "
                         f"{', '.join(map(str, AITER_BLOCK_SIZES))}, no window or soft cap",
                         "aiter.paged_attention_rocm"),
        InternalFallback("any query length > 1 (prefill, chunked prefill, mixed)", _TRITON),
        InternalFallback("sliding window, or head size < 64 (vLLM #34570)", _TRITON),
        InternalFallback("soft cap, or another head or block size", _TRITON),
    )
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (
        ("reshape_and_cache", "triton_rocm_pa"), ("paged_attention", "aiter"))

    @classmethod
    def get_name(cls) -> str:
        return "ROCM_AITER"


class RocmTritonMLABackend(VariantBackedMLA):
    """hwplug-triton's latent cache write and absorbed-form latent attention kernels."""

    platforms: ClassVar[tuple[str, ...]] = ("rocm",)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (
        *FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES)
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (
        ("concat_and_cache_mla", "triton_rocm"), ("mla_attention", "triton_rocm"))

    @classmethod
    def get_name(cls) -> str:
        return "ROCM_TRITON_MLA"
