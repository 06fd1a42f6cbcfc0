"""hwplug hooks of hwplug-xpu: hwplug-triton's kernels for Intel GPUs, IPEX's cache write
and paged attention where intel-extension-for-pytorch is installed, and the
``XPU_IPEX`` / ``XPU_TRITON`` backends (with ``XPU_TRITON_MLA`` for latent attention).

Everything is registered lazily (``"module:function"``): triton, torch and IPEX are
imported only when a variant is first considered on an XPU.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import hwplug_triton
from hwplug import hookimpl
from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

hwplug_api_version = ">=1,<2"

#: The IPEX releases whose ``ipex.llm.modules.PagedAttention`` frontend the calls are written
#: for: executed with 2.8.0's CPU build (``make test-ipex``); 2.7.0's frontend has the same
#: signatures; 2.6 lacks ``reshape_and_cache_flash`` and the window and soft-cap arguments.
IPEX_REQUIREMENT = ">=2.7,<2.9"
_IPEX = {"platforms": ("xpu",), "dtypes": ("bfloat16", "float16"), "features": ("xmx",),
         "packages": {"intel-extension-for-pytorch": IPEX_REQUIREMENT}, "priority": 20}


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    hwplug_triton.register(registry, platforms=("xpu",), name="triton_xpu")
    registry.register_variant(
        "reshape_and_cache", "ipex", "hwplug_xpu.ipex_attention:reshape_and_cache",
        supports="hwplug_xpu.ipex_attention:cache_supported",
        description="IPEX PagedAttention.reshape_and_cache_flash", **_IPEX)
    registry.register_variant(
        "paged_attention", "ipex", "hwplug_xpu.ipex_attention:paged_attention",
        supports="hwplug_xpu.ipex_attention:attention_supported",
        description="IPEX PagedAttention.flash_attn_varlen_func", **_IPEX)


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("XPU_IPEX", "hwplug_xpu.backends:IpexAttentionBackend")
    registry.register("XPU_TRITON", "hwplug_xpu.backends:XpuTritonBackend")
    registry.register("XPU_TRITON_MLA", "hwplug_xpu.backends:XpuTritonMLABackend")


@hookimpl
def hwplug_platform_resolved(platform: Platform) -> None:
    """Say where intel-extension-for-pytorch would help and is missing."""
    if platform.name == "xpu" and importlib.util.find_spec("intel_extension_for_pytorch") is None:
        logger.info("intel-extension-for-pytorch is not installed (optional: "
                    "pip install \"hwplug-xpu[ipex]\"); XPU_TRITON serves attention")
