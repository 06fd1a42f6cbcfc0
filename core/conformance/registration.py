"""Registration hygiene: the plugin loads, its hooks match the hookspecs, and everything it
registered is importable, of the right kind and named as it says it is."""

from __future__ import annotations

from typing import Any

from hwplug import discovery, registries
from hwplug.conformance.result import Status
from hwplug.conformance.target import Target
from hwplug.dtypes import DTYPE_NAMES
from hwplug.kv_cache_layout import ANY_LAYOUT
from hwplug.platform_interface import DeviceCapability
from hwplug.registry import Entry, Registry

Outcome = tuple[Status, str]


def check_loads(target: Target) -> Outcome:
    """Each of the plugin's entry points imported, its hooks ran, and it declares its API
    range."""
    problems, loaded = [], []
    for ep in target.plugin_eps:
        record = next((r for r in target.records if r.name == ep.name), None)
        if record is None:
            problems.append(f"no discovery record for plugin {ep.name!r}: is it allowed by "
                            "HWPLUG_PLUGINS?")
            continue
        if record.status != "loaded":
            problems.append(f"{ep.name}: {record.status}: {record.reason}")
            continue
        declared = getattr(ep.load(), "hwplug_api_version", None)
        if declared is None:
            major = int(discovery.API_VERSION.split(".")[0])
            problems.append(f"{ep.name} declares no hwplug_api_version; add e.g. "
                            f"hwplug_api_version = \">={major},<{major + 1}\"")
            continue
        loaded.append(f"{ep.name} from {record.distribution} {record.version}, built for "
                      f"API {declared}")
    if problems:
        return "failed", "; ".join(problems)
    return "passed", f"{'; '.join(loaded)}; this hwplug provides API {discovery.API_VERSION}"


def check_hooks(target: Target) -> Outcome:
    """Every ``hwplug_*`` function is a marked hook implementation matching a hookspec."""
    problems, hooks = [], set()
    for ep, module in zip(target.plugin_eps, target.plugin_modules(), strict=True):
        host = discovery.PluginHost()
        scratch = discovery.PluginRecord(ep.name, discovery.PLUGIN_GROUP, "", None, None)
        problems += [f"{ep.name}.{name} is not decorated with @hwplug.hookimpl, so it is never "
                     "called" for name in dir(module)
                     if name.startswith("hwplug_") and callable(getattr(module, name))
                     and host.pm.parse_hookimpl_opts(module, name) is None]
        if not host.add(scratch, module):
            problems.append(scratch.reason)
            continue
        hooks.update(caller.name for caller in host.pm.get_hookcallers(module) or [])
    if problems:
        return "failed", "; ".join(problems)
    return "passed", f"hooks: {', '.join(sorted(hooks)) or 'none'}"


def _owned(registry: Registry[Any], target: Target) -> list[Entry[Any]]:
    return [e for e in registry.entries()
            if e.source in target.sources and e.status != "removed"]


def _interface_problems(kind: str, registry: Registry[Any], entry: Entry[Any],
                        base: type | None) -> list[str]:
    try:
        obj = registry.get(str(entry.target) if entry.alias else entry.name)
    except Exception as exc:
        return [f"{kind} {entry.name!r} fails to import: {exc!r}"]
    if base is None:
        return []
    if not isinstance(obj, type) and isinstance(obj, base):  # an instance: a layout
        return [] if obj.name == entry.name else [
            f"{kind} registered as {entry.name!r} but its name is {obj.name!r}"]
    if not (isinstance(obj, type) and issubclass(obj, base)):
        return [f"{kind} {entry.name!r} is {obj!r}, not a {base.__name__} subclass"]
    expected = entry.replacement if entry.alias else entry.name
    if obj.get_name() != expected:
        return [f"{kind} registered as {expected!r} but its get_name() returns "
                f"{obj.get_name()!r}"]
    return []


def _variant_problems(entry: Entry[Any]) -> list[str]:
    from hwplug import kernels
    from hwplug.conformance.variants import missing_package

    variant, problems = entry.target, []
    if variant.op not in kernels.ops():
        return [f"kernel variant {entry.name!r} names op {variant.op!r}, which does not exist "
                f"(ops: {', '.join(kernels.ops())})"]
    if entry.name != variant.key:
        problems.append(f"kernel variant registered as {entry.name!r} but its key is "
                        f"{variant.key!r}")
    unknown = [d for d in variant.requirements.dtypes if d not in DTYPE_NAMES]
    if unknown:
        problems.append(f"kernel variant {variant.key} declares unknown dtypes "
                        f"{', '.join(unknown)} (known: {', '.join(DTYPE_NAMES)})")
    layouts = [name for name in variant.layouts
               if name != ANY_LAYOUT and name not in registries.kv_layouts]
    if layouts:
        problems.append(f"kernel variant {variant.key} declares unregistered KV-cache layouts "
                        f"{', '.join(layouts)} (registered: "
                        f"{', '.join(registries.kv_layouts.names())})")
    for bound in filter(None, (variant.requirements.min_capability,
                               variant.requirements.max_capability)):
        try:
            DeviceCapability.parse(bound)
        except ValueError:
            problems.append(f"kernel variant {variant.key} has capability {bound!r}; "
                            "write it as 'major.minor'")
    if not missing_package(variant):
        try:
            variant.load()
        except Exception as exc:
            problems.append(f"kernel variant {variant.key} fails to import: {exc!r}")
    return problems


def check_names(target: Target) -> Outcome:
    """Everything the plugin registered imports, is the right kind, and is named by its
    ``get_name()``; kernel variants name an existing op and known dtypes."""
    from hwplug import kernels
    from hwplug.attention import AttentionBackend
    from hwplug.connector import Connector
    from hwplug.kv_cache_layout import KVCacheLayout
    from hwplug.quantization import QuantMethod

    kinds: list[tuple[str, Registry[Any], type | None]] = [
        ("KV-cache layout", registries.kv_layouts, KVCacheLayout),
        ("attention backend", registries.attention_backends, AttentionBackend),
        ("quant method", registries.quant_methods, QuantMethod),
        ("connector", registries.connectors, Connector),
        ("model", registries.models, None),
    ]
    problems: list[str] = []
    counts: list[str] = []
    for kind, registry, base in kinds:
        owned = _owned(registry, target)
        counts.append(f"{kind}s: {len(owned)}")
        for entry in owned:
            problems += _interface_problems(kind, registry, entry, base)
    variants = _owned(kernels, target)
    counts.append(f"kernel variants: {len(variants)}")
    for entry in variants:
        problems += _variant_problems(entry)
    if problems:
        return "failed", "; ".join(problems)
    return "passed", "; ".join(counts)
