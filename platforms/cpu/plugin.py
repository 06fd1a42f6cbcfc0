"""hwplug hooks of the built-in CPU platform: the kernel variants it adds over the references.

Loaded like any plugin (entry point ``cpu`` of group ``hwplug.plugins`` in hwplug's own
distribution). Every variant is declared for the ``cpu`` platform, so it also serves
platforms of the ``cpu`` family (hwplug-cpu-arm); what needs more than "a CPU" says so as
device features (oneDNN's packed linear is validated on x86 only, its bf16 path needs
bf16 arithmetic).
"""

from __future__ import annotations

from typing import Any

from hwplug.dtypes import FLOAT_DTYPES
from hwplug.hookspecs import hookimpl

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override

_KERNELS = "hwplug.platforms.cpu.kernels:"
_LINEAR = "hwplug.platforms.cpu.onednn:linear"
_ONEDNN = "oneDNN matmul on a weight reordered once into its blocked layout"
#: The variants hwplug adds over the references on CPUs (register_variant arguments).
CPU_VARIANTS: list[dict[str, Any]] = [
    dict(op="linear", name="onednn_packed", impl=_LINEAR, dtypes=("float32",),
         features=("x86_64",), description=_ONEDNN),
    dict(op="linear", name="onednn_packed_bf16", impl=_LINEAR, dtypes=("bfloat16",),
         features=("x86_64", "bf16"), description=_ONEDNN + " (bf16 arithmetic)"),
    dict(op="rms_norm", name="torch_fused", impl=_KERNELS + "rms_norm", dtypes=FLOAT_DTYPES,
         description="torch's fused F.rms_norm"),
    dict(op="rotary_embedding", name="torch_fused", impl=_KERNELS + "rotary_embedding",
         dtypes=FLOAT_DTYPES,
         description="x * cos + swap(x) * sin, cos/sin expanded once per call"),
    dict(op="reshape_and_cache", name="index_copy", impl=_KERNELS + "reshape_and_cache",
         supports=_KERNELS + "cache_supported", dtypes=FLOAT_DTYPES,
         description="one index_copy_ per half of the cache"),
    # fp32 only: torch's CPU SDPA is several times slower in bf16 than the reference
    dict(op="paged_attention", name="sdpa_decode", impl=_KERNELS + "decode_attention",
         supports=_KERNELS + "decode_supported", dtypes=("float32",),
         description="decode batches up to 16 MiB of K/V: gather the blocks, one SDPA call"),
]


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for variant in CPU_VARIANTS:
        registry.register_variant(platforms=("cpu",), priority=10, **variant)
