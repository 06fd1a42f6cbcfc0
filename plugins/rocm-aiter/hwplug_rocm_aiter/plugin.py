"""hwplug hooks of hwplug-rocm-aiter: the ``ROCM_PA`` KV-cache layout, hwplug-triton's
kernels gated for ROCm (``triton_rocm`` for the NHD ops, ``triton_rocm_pa``: the cache
write and attention over ``ROCM_PA``), AITER's paged attention over ``ROCM_PA`` where
``amd-aiter`` is installed, and the ``ROCM_AITER`` / ``ROCM_TRITON`` backends (with
``ROCM_TRITON_MLA`` for latent attention, on ``triton_rocm``'s MLA kernels).

Everything is registered lazily (``"module:function"``): triton, torch and aiter are
imported only when a variant is first considered on a ROCm device.
"""

from __future__ import annotations

from typing import Any

import hwplug_triton
from hwplug import hookimpl
from hwplug.dtypes import FNUZ_DTYPES, FNUZ_FEATURE

hwplug_api_version = ">=1,<2"

#: Triton's ROCm backend targets CDNA (gfx908, gfx90a: 9.0; gfx942: 9.4; gfx950: 9.5)
#: and RDNA3/4 (11.x, 12.x).
TRITON_MIN_CAPABILITY = "9.0"
#: The AITER release the call (:mod:`hwplug_rocm_aiter.aiter_api`) is written for, and the
#: requirement the variant's package gate and the ``aiter`` extra declare: that series.
TESTED_AITER = "0.1.20"
AITER_REQUIREMENT = "==0.1.20.*"
#: The name of the plugin's KV-cache layout (:mod:`hwplug_rocm_aiter.layout`).
LAYOUT = "ROCM_PA"
#: The cache ops' Triton kernels over ``ROCM_PA``: op -> module.
ROCM_PA_KERNELS = {"reshape_and_cache": "hwplug_rocm_aiter.cache_rocm_pa",
                   "paged_attention": "hwplug_rocm_aiter.attention_rocm_pa"}


@hookimpl
def hwplug_register_kv_layouts(registry: Any) -> None:
    registry.register(LAYOUT, "hwplug_rocm_aiter.layout:ROCM_PA")


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    hwplug_triton.register(registry, platforms=("rocm",), name="triton_rocm",
                           min_capability=TRITON_MIN_CAPABILITY)
    hwplug_triton.register(registry, platforms=("rocm",), name="triton_rocm_pa",
                           ops=tuple(ROCM_PA_KERNELS), modules=ROCM_PA_KERNELS,
                           layouts=(LAYOUT,), min_capability=TRITON_MIN_CAPABILITY)
    # OCP fp8 (e4m3fn / e5m2) checkpoints: gfx950 and RDNA4; fnuz ones (OCP e4m3
    # checkpoints converted by the fp8 method) where the ISA computes in fnuz, gfx942
    hwplug_triton.register(registry, platforms=("rocm",), name="triton_rocm",
                           ops=hwplug_triton.FP8_OPS, min_capability="9.5")
    hwplug_triton.register(registry, platforms=("rocm",), name="triton_rocm_fnuz",
                           ops=hwplug_triton.FP8_OPS, dtypes=FNUZ_DTYPES,
                           features=(FNUZ_FEATURE,))
    registry.register_variant(
        "paged_attention", "aiter", "hwplug_rocm_aiter.aiter_api:paged_attention",
        supports="hwplug_rocm_aiter.aiter_attention:supported", platforms=("rocm",),
        dtypes=("bfloat16", "float16"), min_capability=TRITON_MIN_CAPABILITY,
        packages={"amd-aiter": AITER_REQUIREMENT}, priority=20, layouts=(LAYOUT,),
        description="AITER paged_attention_rocm (decode batches)")


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("ROCM_AITER", "hwplug_rocm_aiter.backends:AiterAttentionBackend")
    registry.register("ROCM_TRITON", "hwplug_rocm_aiter.backends:RocmTritonBackend")
    registry.register("ROCM_TRITON_MLA", "hwplug_rocm_aiter.backends:RocmTritonMLABackend")
