"""Attention backends whose kernels are registry variants, and the facts that say where.

A GPU plugin's backend (hwplug-cuda's ``TRITON_ATTN``, hwplug-rocm-aiter's
``ROCM_TRITON`` / ``ROCM_AITER``, hwplug-xpu's ``XPU_TRITON`` / ``XPU_IPEX``) computes
like ``TORCH_PAGED``, through the registry's ops, and adds one fact: it serves a spec only
where the registry would choose its own variant of each op it runs. So
``HWPLUG_DISABLED_KERNELS=paged_attention/triton``, a preference for another variant or
a vendor library that is not installed shows up as the backend's rejection reason, not
as a silent change of kernels.

An MLA backend of a GPU plugin (hwplug-cuda's ``TRITON_MLA``, hwplug-rocm-aiter's
``ROCM_TRITON_MLA``, hwplug-xpu's ``XPU_TRITON_MLA``) is a
:class:`VariantBackedMLA`: ``TORCH_MLA``'s computation (``concat_and_cache_mla``, then
``mla_attention``, layout ``MLA``) with the same fact for the MLA ops; the platforms list
it before ``TORCH_MLA``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionSpec, InternalFallback
from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.torch_mla import TorchMLABackend
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug_triton.kernels import MAX_HEAD_SIZE

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform


class VariantBackedAttention(TorchPagedBackend):
    """``TORCH_PAGED`` (layout ``NHD``, K/V written in ``forward``) that serves a spec only
    where the registry chooses, for each ``(op, variant)`` of ``_kernels``, that variant,
    for head sizes up to ``_max_head_size``. Subclasses name themselves (``get_name``) and
    state ``_kernels``; a backend of another registered layout names it in
    ``kv_cache_layout`` and lists that layout's variants in ``_kernels``."""

    #: ``(op, variant)``: the ops the backend runs (each dispatches on a tensor in the
    #: model dtype) and the variant that must serve each.
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (("reshape_and_cache", "triton"),
                                                       ("paged_attention", "triton"))
    _max_head_size: ClassVar[int] = MAX_HEAD_SIZE

    @classmethod
    def validate(cls, spec: AttentionSpec, platform: Platform | None = None) -> list[str]:
        reasons = super().validate(spec, platform)
        if spec.head_size > cls._max_head_size:
            reasons.append(f"head size {spec.head_size} above {cls._max_head_size}")
        if platform is not None and not reasons:
            reasons += variant_reasons(cls._kernels, spec, platform, cls.kv_cache_layout)
        return reasons


class VariantBackedMLA(TorchMLABackend):
    """``TORCH_MLA`` (layout ``MLA``, latents written in ``forward_mla``) that serves an MLA
    spec only where the registry chooses, for each ``(op, variant)`` of ``_kernels``, that
    variant. Subclasses name themselves (``get_name``), state their ``platforms``, KV-cache
    dtypes and ``_kernels`` (the name their plugin registers the Triton kernels under)."""

    #: ``(op, variant)``: the MLA ops the backend runs and the variant that must serve each.
    _kernels: ClassVar[tuple[tuple[str, str], ...]] = (("concat_and_cache_mla", "triton"),
                                                       ("mla_attention", "triton"))
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = (
        InternalFallback("any batch (prefill, chunks and decode alike)",
                         "absorbed-form kernel: W_UK folded into the query, the latents "
                         "as one shared KV head, W_UV after"),
    )

    @classmethod
    def validate(cls, spec: AttentionSpec, platform: Platform | None = None) -> list[str]:
        reasons = super().validate(spec, platform)
        if platform is not None and not reasons:
            reasons += variant_reasons(cls._kernels, spec, platform, cls.kv_cache_layout)
        return reasons


def variant_reasons(wanted: tuple[tuple[str, str], ...], spec: AttentionSpec,
                    platform: Platform, layout: str) -> list[str]:
    """Why the registry would not choose, for each ``(op, variant)`` of ``wanted``, that
    variant for ``spec`` on ``platform`` over a cache in ``layout`` (empty: it would, for
    every op)."""
    reasons = []
    for op, variant in wanted:
        why = kernels.explain(op, platform, platform.device_type, spec.dtype, layout=layout)
        if why.chosen is None or why.chosen.name != variant:
            ranked = f"{why.chosen.name} ranks first" if why.chosen else "no variant serves"
            reasons.append(f"{op} would not use its {variant} variant: "
                           f"{why.rejected.get(variant, ranked)}")
    return reasons
