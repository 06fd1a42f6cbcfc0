"""The process-wide registries, and which registration hook fills each.

Each is filled by discovery, which runs before the first read of any of them (so
``registries.connectors.names()`` in a fresh process lists the plugins' connectors too).

Core defines the registries of its interfaces here. The kernel registry lives with the
ops in :mod:`hwplug.kernel_registry`, which sits above core: it attaches itself with
:func:`attach` when imported (hwplug's own kernel plugin imports it before any hook
runs), so discovery passes it to ``hwplug_register_kernels`` without core importing it.
"""

from __future__ import annotations

from typing import Any

from hwplug.errors import PluginError
from hwplug.registry import Registry

__all__ = ["attention_backends", "connectors", "kv_layouts", "models", "proposers",
           "quant_methods"]

#: What fills the process registries before their first read: discovery (once per process;
#: ``hwplug.discovery.reset`` makes the next read run it again). Named, not imported:
#: discovery sits beside the registries it fills.
DISCOVERY = "hwplug.discovery.state:fill_registries"

#: KV-cache layouts by name (:class:`~hwplug.kv_cache_layout.KVCacheLayout` instances);
#: core's layouts ``NHD`` (the reference) and ``MLA`` are registered in code, so they
#: survive a reset.
kv_layouts: Registry[Any] = Registry("KV-cache layout", DISCOVERY)
kv_layouts.register("NHD", "hwplug.kv_cache_layout:NHD")
kv_layouts.register("MLA", "hwplug.kv_cache_layout:MLA")

attention_backends: Registry[Any] = Registry("attention backend", DISCOVERY)
quant_methods: Registry[Any] = Registry("quantization method", DISCOVERY)
connectors: Registry[Any] = Registry("connector", DISCOVERY)
models: Registry[Any] = Registry("model architecture", DISCOVERY)
#: Speculative decoding's proposers by method name (``speculative_config={"method": ...}``).
proposers: Registry[Any] = Registry("speculative proposer", DISCOVERY)

#: Registration hook name -> the registry its implementations fill.
_BY_HOOK: dict[str, Registry[Any]] = {
    "hwplug_register_kv_layouts": kv_layouts,
    "hwplug_register_attention_backends": attention_backends,
    "hwplug_register_quant_methods": quant_methods,
    "hwplug_register_connectors": connectors,
    "hwplug_register_models": models,
    "hwplug_register_proposers": proposers,
}
#: Every registration hook, in the order discovery calls them (layouts first: backends
#: and kernel variants name them).
REGISTRATION_HOOKS = (
    "hwplug_register_kv_layouts",
    "hwplug_register_attention_backends",
    "hwplug_register_kernels",
    "hwplug_register_quant_methods",
    "hwplug_register_connectors",
    "hwplug_register_models",
    "hwplug_register_proposers",
)


def attach(hook: str, registry: Registry[Any]) -> None:
    """Make ``registry`` the one passed to registration hook ``hook``."""
    if hook not in REGISTRATION_HOOKS:
        raise PluginError(f"{hook!r} is not a registration hook; hooks: "
                          f"{', '.join(REGISTRATION_HOOKS)}")
    _BY_HOOK[hook] = registry


def for_hook(hook: str) -> Registry[Any]:
    """The registry hook ``hook`` fills; :class:`PluginError` when none is attached (the
    kernel registry attaches on import, which hwplug's own plugins guarantee)."""
    try:
        return _BY_HOOK[hook]
    except KeyError:
        raise PluginError(f"no registry is attached for {hook}: hwplug's own entry points are "
                          "missing (reinstall hwplug)") from None


def every() -> list[Registry[Any]]:
    """Every attached registry."""
    return list(_BY_HOOK.values())
