"""hwplug-xpu's attention backends, both over the ``NHD`` KV layout:

* ``XPU_IPEX``: intel-extension-for-pytorch's paged flash attention (the ``ipex``
  variants of ``reshape_and_cache`` and ``paged_attention``). It serves only where the
  registry chooses them, so without the package, on a GPU without XMX engines or for a
  float32 model (IPEX has no fp32 kernels, vLLM #31762) its rejection reason says which.
* ``XPU_TRITON``: hwplug-triton's kernels (``triton_xpu``), which Intel's Triton backend
  compiles on the device; every dtype, the float32 models' backend.

Both write the step's K/V inside ``forward``. ``XPU_TRITON_MLA`` serves multi-head latent
attention (DeepSeek) over the ``MLA`` latent cache with hwplug-triton's MLA kernels
(``triton_xpu``), before ``TORCH_MLA``.
"""

from __future__ import annotations

from typing import ClassVar

from hwplug.attention import InternalFallback
from hwplug.dtypes import FLOAT_DTYPES
from hwplug_triton.backend import VariantBackedAttention, VariantBackedMLA


class XpuTritonBackend(VariantBackedAttention):
    """hwplug-triton's split-KV decode and paged flash-attention prefill kernels."""

    platforms: ClassVar[tuple[str, ...]] = ("xpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("every query length is 1", "split-KV decode kernel"),
        InternalFallback("any query length > 1", "paged flash-attention prefill kernel"),
    )
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (("reshape_and_cache", "triton_xpu"),
                                                       ("paged_attention", "triton_xpu"))

    @classmethod
    def get_name(cls) -> str:
        return "XPU_TRITON"


class IpexAttentionBackend(VariantBackedAttention):
    """IPEX's ``flash_attn_varlen_func`` over the paged cache, for bf16 / fp16 models."""

    platforms: ClassVar[tuple[str, ...]] = ("xpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16")
    supported_block_sizes: ClassVar[tuple[int, ...]] = (64, 128)
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("float32 model (no IPEX kernels, vLLM #31762)",
                         "the XPU_TRITON backend, chosen at configuration with one warning"),
    )
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (("reshape_and_cache", "ipex"),
                                                       ("paged_attention", "ipex"))

    @classmethod
    def get_name(cls) -> str:
        return "XPU_IPEX"


class XpuTritonMLABackend(VariantBackedMLA):
    """hwplug-triton's latent cache write and absorbed-form latent attention kernels."""

    platforms: ClassVar[tuple[str, ...]] = ("xpu",)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (
        ("concat_and_cache_mla", "triton_xpu"), ("mla_attention", "triton_xpu"))

    @classmethod
    def get_name(cls) -> str:
        return "XPU_TRITON_MLA"
