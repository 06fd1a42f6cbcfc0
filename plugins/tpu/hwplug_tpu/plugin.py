"""hwplug hooks of hwplug-tpu: the ``RPA_INTERLEAVED`` KV-cache layout, the JAX kernel
variants (mixture-of-experts and latent-attention ops included), ``PALLAS_RPA``, the MLA
backend ``JAX_MLA`` and the torch_xla tombstones.

Kernels are registered as lazy ``"module:function"`` strings, so jax is imported only
when a variant is first considered. Every variant runs on the ``tpu`` platform, in
float32 and bfloat16; the cache-op variants serve the ``RPA_INTERLEAVED`` layout only, and
the ``pallas`` attention variant needs JAX to drive a TPU v4 or newer (device feature
``jax-tpu``, capability 4.0). The torch_xla path that TPU support
used to take is removed: asking for its attention backends (``TORCH_XLA``, or
``PALLAS``, the name vLLM's torch_xla backend had) raises
:class:`~hwplug.errors.RemovedError` naming ``PALLAS_RPA``.
"""

from __future__ import annotations

from typing import Any

from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

_V = "hwplug_tpu.variants:"
#: The plugin's KV-cache layout (:mod:`hwplug_tpu.layout`), the one its cache-op variants
#: serve.
LAYOUT = "RPA_INTERLEAVED"
_JAX = {"platforms": ("tpu",), "dtypes": ("float32", "bfloat16"), "priority": 10}
_JITTED = "jitted JAX function, tokens padded to power-of-two buckets"
_RPA = "ragged paged attention, batch padded to power-of-two buckets"
_MOE, _MLA = "hwplug_tpu.variants_moe:", "hwplug_tpu.variants_mla:"
_SORTED = "tokens sorted by expert, grouped matmuls (jax.lax.ragged_dot)"
#: The variants hwplug-tpu registers (register_variant arguments besides ``_JAX``).
TPU_VARIANTS: list[dict[str, Any]] = [
    dict(op="rms_norm", name="jax", impl=_V + "rms_norm", description=_JITTED),
    dict(op="rotary_embedding", name="jax", impl=_V + "rotary_embedding", description=_JITTED),
    dict(op="silu_and_mul", name="jax", impl=_V + "silu_and_mul", description=_JITTED),
    dict(op="gelu_and_mul", name="jax", impl=_V + "gelu_and_mul",
         supports=_V + "gelu_supported", description=_JITTED),
    dict(op="linear", name="jax", impl=_V + "linear", description=_JITTED),
    dict(op="embedding", name="jax", impl=_V + "embedding", dtypes=(),
         description=_JITTED),
    dict(op="reshape_and_cache", name="jax", impl=_V + "reshape_and_cache",
         supports=_V + "cache_supported", layouts=(LAYOUT,),
         description="rows interleaved, cast and scattered in JAX, into the resident cache"),
    dict(op="paged_attention", name="jax", impl=_V + "paged_attention",
         supports=_V + "attention_supported", layouts=(LAYOUT,),
         description="pure-JAX " + _RPA),
    dict(op="paged_attention", name="pallas", impl=_V + "pallas_paged_attention",
         supports=_V + "attention_supported", layouts=(LAYOUT,), features=("jax-tpu",),
         min_capability="4.0", priority=20, description="JAX's Pallas TPU kernel: " + _RPA),
    dict(op="moe_topk", name="jax", impl=_MOE + "moe_topk", description=_JITTED),
    dict(op="moe_experts", name="jax", impl=_MOE + "moe_experts",
         supports=_MOE + "experts_supported", description=_SORTED),
    dict(op="fused_moe", name="jax", impl=_MOE + "fused_moe",
         supports="hwplug.kernel_registry.moe_compose:fused_supported",
         description="routing, " + _SORTED + ", shared experts: one jitted JAX function"),
    dict(op="concat_and_cache_mla", name="jax", impl=_MLA + "concat_and_cache_mla",
         supports=_MLA + "cache_supported",
         description="latent rows cast and scattered in JAX, into the resident cache"),
    dict(op="mla_attention", name="jax", impl=_MLA + "mla_attention",
         supports=_MLA + "attention_supported",
         description="pure-JAX latent attention, decode absorbed, other batches expanded; "
                     "batch padded to power-of-two buckets"),
]
#: Attention backends of the torch_xla path, now tombstones.
TORCH_XLA_BACKENDS = ("TORCH_XLA", "PALLAS")
_REPLACEMENT = "PALLAS_RPA: TPU support runs through JAX in hwplug-tpu, not torch_xla"


@hookimpl
def hwplug_register_kv_layouts(registry: Any) -> None:
    registry.register(LAYOUT, "hwplug_tpu.layout:RPA_INTERLEAVED")


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for variant in TPU_VARIANTS:
        registry.register_variant(**{**_JAX, **variant})


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("PALLAS_RPA", "hwplug_tpu.attention:PallasRpaBackend")
    registry.register("JAX_MLA", "hwplug_tpu.attention:JaxMlaBackend")
    for name in TORCH_XLA_BACKENDS:
        registry.remove(name, _REPLACEMENT)


@hookimpl
def hwplug_platform_resolved(platform: Any) -> None:
    """On the tpu platform, start counting XLA compilations (what ``hwplug generate``
    reports)."""
    if platform.name == "tpu":
        from hwplug_tpu.compilations import compilations

        compilations()
