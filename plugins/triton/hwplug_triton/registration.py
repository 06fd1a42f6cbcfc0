"""``register``: the one list of hwplug-triton's kernel variants, registered by each GPU
plugin from its own ``hwplug_register_kernels`` hook with its own facts.

Kernels and their ``supported`` checks are registered as lazy ``"module:function"``
strings, so triton is imported only when a variant is first considered. Each entry point
is registered ``.unchecked``: the registry runs the module's ``supported`` once per call.

Every GPU plugin registers :data:`NHD_OPS` and :data:`MLA_OPS` (:data:`DEFAULT_OPS`) with
the gates of its Triton kernels; a plugin
with a KV-cache layout of its own registers its kernel modules for the two cache ops
(built on :func:`~hwplug_triton.kernels.cache.write` and
:func:`~hwplug_triton.kernels.attention.attend`) through the same helper, with
``modules`` and the ``layouts`` they serve. :data:`FP8_OPS` need fp8 dots, whose gate is the device's
own: a plugin registers them in a second call with that gate (NVIDIA: capability 8.9;
AMD: CDNA3 / CDNA4, capability 9.4 to 9.5, whose Triton computes in every fp8 format,
natively or emulated).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hwplug.dtypes import FLOAT_DTYPES

#: The triton releases the kernels are written for.
TRITON_REQUIREMENT = ">=3.0"
_KERNELS = "hwplug_triton.kernels."

#: op -> the kernel module implementing it (the entry point is named like the op).
KERNEL_MODULES = {
    "rms_norm": "norm",
    "rotary_embedding": "rotary",
    "silu_and_mul": "activation",
    "gelu_and_mul": "activation",
    "reshape_and_cache": "cache",
    "paged_attention": "attention",
    "ggml_linear": "ggml_linear",
    "ggml_embedding": "ggml_embedding",
    "scaled_mm": "scaled_mm",
    "moe_experts": "moe",
    "fused_moe": "fused_moe",
    "concat_and_cache_mla": "mla_cache",
    "mla_attention": "mla",
}
#: The layout-free ops (GGUF weights' dequantizing matmul and embedding among them) and the
#: NHD attention pair: what every GPU plugin registers.
NHD_OPS = ("rms_norm", "rotary_embedding", "silu_and_mul", "gelu_and_mul",
           "reshape_and_cache", "paged_attention", "ggml_linear", "ggml_embedding",
           "moe_experts", "fused_moe")
#: The multi-head latent attention ops over the ``MLA`` latent cache (the cache write and
#: the absorbed-form attention), which a GPU plugin's MLA backend runs
#: (:class:`~hwplug_triton.backend.VariantBackedMLA`).
MLA_OPS = ("concat_and_cache_mla", "mla_attention")
#: What :func:`register` registers unless told otherwise: every GPU plugin's ops.
DEFAULT_OPS = (*NHD_OPS, *MLA_OPS)
#: The ops whose kernels dot fp8 tiles (register them with the device's fp8 gate).
FP8_OPS = ("scaled_mm",)
#: dtypes of each op's dispatch tensor that its kernel serves (others: the model dtypes):
#: ``ggml_embedding`` dispatches on its ids (any: the call checks them), ``scaled_mm`` on
#: its fp8 activation (OCP formats). The kernel also computes in fnuz: a plugin whose device
#: does registers it with ``dtypes=("fp8_e4m3fnuz",)`` (hwplug-rocm-aiter on gfx942).
DISPATCH_DTYPES: dict[str, tuple[str, ...]] = {
    "ggml_embedding": (),
    "scaled_mm": ("fp8_e4m3", "fp8_e5m2"),
}


def register(registry: Any, *, platforms: tuple[str, ...], name: str = "triton",
             ops: Iterable[str] = DEFAULT_OPS, priority: int = 10,
             modules: Mapping[str, str] | None = None, **gates: Any) -> None:
    """Register the Triton kernel of each op in ``ops`` as variant ``name`` for
    ``platforms`` (platform or family names) and the op's :data:`DISPATCH_DTYPES`, else model
    dtypes fp32 / bf16 / fp16 (of the op's dispatch tensor: fp8 caches are read and
    written, never dispatched on), gated by ``triton`` being installed plus the caller's
    ``gates`` (:class:`~hwplug.kernel_registry.Variant` facts such as ``min_capability``,
    ``features``, more ``packages``, the ``layouts`` a cache op's kernel serves, or
    ``dtypes`` of the dispatch tensor in place of the op's defaults).

    The kernel of an op is ``hwplug_triton.kernels.<KERNEL_MODULES[op]>``, or the module
    ``modules`` names for it (a plugin's own, with the op's entry point, decorated with
    :func:`~hwplug_triton.kernels.checked`, and a ``supported`` check). A plugin passes the
    facts of its own devices (capability means different things on CUDA and ROCm), and a
    ``name`` no other plugin registers for the same op.
    """
    packages = {"triton": TRITON_REQUIREMENT, **gates.pop("packages", {})}
    dtypes = gates.pop("dtypes", None)
    for op in ops:
        module = (modules or {}).get(op) or _KERNELS + KERNEL_MODULES[op]
        registry.register_variant(
            op, name, f"{module}:{op}.unchecked", supports=f"{module}:supported",
            platforms=platforms, dtypes=dtypes or DISPATCH_DTYPES.get(op, FLOAT_DTYPES),
            priority=priority, packages=packages,
            description=f"hwplug-triton kernel ({module.rsplit('.', 1)[-1]})", **gates)
