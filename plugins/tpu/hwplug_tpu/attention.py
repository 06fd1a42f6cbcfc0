"""``PALLAS_RPA``: ragged paged attention over the KV layout JAX's TPU kernel reads.

One layer's cache is ``[num_blocks, block_size, 2 * Hkv, D]`` with K and V interleaved
along the head axis (layout ``RPA_INTERLEAVED``: KV head ``h``'s key at index ``2h``,
its value at ``2h + 1``), the ``kv_pages`` of
``jax.experimental.pallas.ops.tpu.ragged_paged_attention`` (:mod:`hwplug_tpu.layout`).
The backend computes through the registry's ``reshape_and_cache`` (inside ``forward``)
and ``paged_attention`` with that layout in its params: on the tpu platform the registry
serves them with hwplug-tpu's JAX variants of the layout, JAX's Pallas kernel where JAX
drives a TPU v4 or newer (variant ``pallas``), a pure-JAX ragged paged attention on any
other JAX backend (variant ``jax``); elsewhere the pure-torch references would, through
the layout's view of the same memory as ``NHD``.

``JAX_MLA`` is the platform's latent attention backend (``is_mla``, see
:class:`JaxMlaBackend`).
"""

from __future__ import annotations

from typing import ClassVar

from hwplug.kernel_registry.torch_mla import TorchMLABackend
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug_tpu.layout import RPA_INTERLEAVED


class PallasRpaBackend(TorchPagedBackend):
    """Causal attention (GQA, sliding window, soft cap) for prefill, chunked prefill and
    decode mixed in one batch; bf16 or fp32 caches (no fp8)."""

    platforms: ClassVar[tuple[str, ...]] = ("tpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_block_sizes: ClassVar[tuple[int, ...]] = (8, 16, 32, 64, 128)
    supports_non_causal: ClassVar[bool] = False
    kv_cache_layout: ClassVar[str] = RPA_INTERLEAVED.name

    @classmethod
    def get_name(cls) -> str:
        return "PALLAS_RPA"


class JaxMlaBackend(TorchMLABackend):
    """Multi-head latent attention (DeepSeek-V2/V3, ``is_mla``) on the tpu platform: the
    latents written with ``concat_and_cache_mla``, attention with ``mla_attention``, both
    served there by hwplug-tpu's JAX variants (:mod:`hwplug_tpu.mla`: prefill and mixed
    batches in the expanded form, decode in the absorbed form). The cache is hwplug's
    ``MLA`` layout, ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``, one latent
    row per token; bf16 or fp32 (an fp8 latent cache is ``TORCH_MLA``'s)."""

    platforms: ClassVar[tuple[str, ...]] = ("tpu",)
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float32")
    supported_block_sizes: ClassVar[tuple[int, ...]] = (8, 16, 32, 64, 128)

    @classmethod
    def get_name(cls) -> str:
        return "JAX_MLA"
