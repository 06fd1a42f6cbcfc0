"""The pluggy hook specifications of project ``"hwplug"``: the contract a plugin implements.

A plugin is a module (or object) named by an entry point of the ``hwplug.plugins`` group,
holding functions decorated with :data:`hookimpl`. hwplug calls each plugin's hooks on
its own, so one plugin raising cannot stop the others; a plugin that raises is reported
and everything it registered is dropped. A plugin module may also declare:

``hwplug_api_version``
    A PEP 440 specifier of the hwplug plugin API it was built for, e.g. ``">=1,<2"``;
    a plugin whose range excludes :data:`hwplug.API_VERSION` is skipped and reported.
``hwplug_requires``
    Names of plugins whose hooks must run before this one's (they are loaded first).
``hwplug_order``
    An integer; among plugins free to run in any order, lower runs first (default 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

__all__ = ["hookimpl", "hwplug_platform_resolved", "hwplug_register_attention_backends",
           "hwplug_register_connectors", "hwplug_register_kernels",
           "hwplug_register_kv_layouts", "hwplug_register_models",
           "hwplug_register_proposers", "hwplug_register_quant_methods"]

PROJECT = "hwplug"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def hwplug_register_kv_layouts(registry: Any) -> None:
    """Register KV-cache layouts: ``registry.register(name, layout_or_"module:attr")``.

    A layout is an instance of a :class:`hwplug.kv_cache_layout.KVCacheLayout` subclass
    whose ``name`` equals ``name``: one layer's cache ``shape``, a ``check`` of a tensor,
    exact conversions ``to_reference`` / ``from_reference`` with core's ``NHD`` cache
    ``[2, num_blocks, block_size, Hkv, D]``, and block access for connectors
    (``select_blocks``, ``write_blocks``, ``join_blocks``). Attention backends name it in
    ``kv_cache_layout``; kernel variants of ``reshape_and_cache`` / ``paged_attention``
    that read it declare it in ``layouts``; the reference ops serve it through the
    conversions. Called first, before the other registration hooks; core registers ``NHD``.
    """


@hookspec
def hwplug_register_attention_backends(registry: Any) -> None:
    """Register attention backends: ``registry.register(name, cls_or_"module:Class")``.

    ``name`` must equal the backend's ``get_name()``. Called once per process, after the
    platform is resolved, whether or not this plugin's platform was chosen.
    """


@hookspec
def hwplug_register_kernels(registry: Any) -> None:
    """Register kernel variants of the registry's ops (see :mod:`hwplug.kernel_registry`).

    Use ``registry.register_variant(op, name, impl, platforms=..., priority=...,
    packages=..., supports=...)``; ``impl`` and ``supports`` may be lazy
    ``"module:function"`` strings so importing the kernel library (e.g. triton) waits
    until the variant is first considered.
    """


@hookspec
def hwplug_register_quant_methods(registry: Any) -> None:
    """Register :class:`hwplug.QuantMethod` subclasses by their quantization name."""


@hookspec
def hwplug_register_connectors(registry: Any) -> None:
    """Register :class:`hwplug.Connector` subclasses by name."""


@hookspec
def hwplug_register_models(registry: Any) -> None:
    """Register model architectures: ``registry.register("LlamaForCausalLM", "mod:Class")``."""


@hookspec
def hwplug_register_proposers(registry: Any) -> None:
    """Register speculative decoding's proposers: ``registry.register("ngram",
    "mod:Class")``, a :class:`hwplug.model_zoo.speculative.Proposer` subclass; the name is
    what ``speculative_config={"method": name}`` selects."""


@hookspec
def hwplug_platform_resolved(platform: Platform) -> None:
    """Called once with the resolved platform instance, after every registration hook."""
