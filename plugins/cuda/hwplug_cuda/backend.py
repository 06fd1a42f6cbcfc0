"""``TRITON_ATTN``: paged attention on NVIDIA GPUs served by hwplug-cuda's Triton kernels.

It computes like ``TORCH_PAGED`` (the registry's ``reshape_and_cache`` and
``paged_attention`` ops, layout ``NHD``, the same bytes, so blocks move between the two
unchanged) and adds facts: it serves a spec only where the registry would choose the
``triton`` variant of both ops for it, so ``HWPLUG_DISABLED_KERNELS=triton`` or a
preference for another variant shows up as a rejection reason, not as a silent change of
kernels. The new K/V are written inside ``forward``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionSpec, InternalFallback
from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug_cuda.kernels import MAX_HEAD_SIZE

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

#: The ops this backend runs, each of which the ``triton`` variant must serve.
TRITON_OPS = ("reshape_and_cache", "paged_attention")


class TritonAttentionBackend(TorchPagedBackend):
    """Decode: GQA-grouped split-KV kernel. Prefill and mixed batches: a flash-attention
    kernel tiled over the block table. Both behind the one ``paged_attention`` op."""

    platforms: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    #: Any head size up to ``MAX_HEAD_SIZE`` (checked in :meth:`validate`); any block size
    #: works, these are the ones offered when settling the cache.
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128)
    min_capability: ClassVar[str | None] = "8.0"
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
        if platform is not None and not reasons:
            reasons += _variant_reasons(spec, platform)
        return reasons


def _variant_reasons(spec: AttentionSpec, platform: Platform) -> list[str]:
    """Why the registry would not choose the triton variant of each op for ``spec``."""
    reasons = []
    for op in TRITON_OPS:  # both dispatch on a tensor in the model dtype
        why = kernels.explain(op, platform, platform.device_type, spec.dtype)
        if why.chosen is None or why.chosen.name != "triton":
            rejected = why.rejected.get("triton", f"{why.chosen.name if why.chosen else 'none'} "
                                                  "ranks first")
            reasons.append(f"{op} would not use its triton variant: {rejected}")
    return reasons
