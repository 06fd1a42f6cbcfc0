"""hwplug: plugin-based hardware abstraction for LLM inference.

``import hwplug`` is cheap: it imports neither torch nor any plugin. The platform is
resolved and plugins are loaded on first use of :func:`current_platform` (or of
anything that needs it). Public names are loaded lazily from their modules; this facade
is the one place core names the layers above it (kernel registry, model zoo).
"""

from __future__ import annotations

import importlib
from typing import Any

from hwplug.hookspecs import hookimpl

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_LAZY = {
    "API_VERSION": "hwplug.discovery",
    "current_platform": "hwplug.discovery",
    "Platform": "hwplug.platform_interface",
    "DeviceCapability": "hwplug.device",
    "DeviceFacts": "hwplug.device",
    "AttentionBackend": "hwplug.attention",
    "AttentionSpec": "hwplug.attention",
    "AttentionMetadata": "hwplug.attention",
    "PagedAttentionParams": "hwplug.attention",
    "KVCacheLayout": "hwplug.kv_cache_layout",
    "QuantMethod": "hwplug.quantization",
    "ScaleDescriptor": "hwplug.quantization",
    "Connector": "hwplug.connector",
    "ConnectorMetadata": "hwplug.connector",
    "KVLayout": "hwplug.connector",
    "EngineConfig": "hwplug.config",
    "kernels": "hwplug.kernel_registry",
    "register_model": "hwplug.model_zoo.registry",
    "LLM": "hwplug.model_zoo.llm",
    "SamplingParams": "hwplug.model_zoo.sampling",
}
#: Public submodules.
_MODULES = {"ops": "hwplug.kernel_registry.ops", "envs": "hwplug.envs", "errors": "hwplug.errors"}

__all__ = ["hookimpl", "__version__", *_LAZY, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'hwplug' has no attribute {name!r}")
    globals()[name] = value
    return value
