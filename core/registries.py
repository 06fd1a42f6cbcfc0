"""The process-wide registries plugins and users fill (kernels live in hwplug.kernel_registry)."""

from __future__ import annotations

from typing import Any

from hwplug.registry import Registry

attention_backends: Registry[Any] = Registry("attention backend")
quant_methods: Registry[Any] = Registry("quantization method")
connectors: Registry[Any] = Registry("connector")
models: Registry[Any] = Registry("model architecture")
