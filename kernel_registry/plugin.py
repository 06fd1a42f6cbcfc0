"""hwplug hooks of the kernel registry: the ``TORCH_PAGED`` and ``TORCH_MLA`` attention
backends.

Loaded like any plugin (entry point ``hwplug-attention`` of group ``hwplug.plugins`` in
hwplug's own distribution). Importing it imports its package, :mod:`hwplug.kernel_registry`,
which attaches the kernel registry before any registration hook runs.
"""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("TORCH_PAGED", "hwplug.kernel_registry.torch_paged:TorchPagedBackend")
    registry.alias("REFERENCE", "TORCH_PAGED")
    registry.register("TORCH_MLA", "hwplug.kernel_registry.torch_mla:TorchMLABackend")
