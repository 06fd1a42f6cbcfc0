"""Finding and loading platforms and plugins through entry points.

On first :func:`current_platform` hwplug (1) asks every ``hwplug.platforms`` entry point
whether its hardware is present (a cheap call, no torch import), (2) ranks the active
candidates (accelerators above CPUs, plugins above the built-in CPU platform, then the
platform's ``priority``) or takes the one ``HWPLUG_PLATFORM`` forces, (3) imports the
``hwplug.plugins`` entry points (those of other platforms' distributions are not imported
when a platform is forced), checks their API range, orders them by ``hwplug_requires`` /
``hwplug_order``, and calls their hooks one plugin at a time. A plugin that fails is
skipped, its registrations dropped and its traceback kept for ``hwplug info``;
``HWPLUG_STRICT_PLUGINS=1`` makes that an error. Everything is idempotent per process,
and a spawned worker simply runs it again.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import importlib_metadata
import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from hwplug import envs, hookspecs, registries
from hwplug.errors import PlatformError, PluginError
from hwplug.registry import Registry, current_source, import_object

logger = logging.getLogger(__name__)

#: Version of the plugin API (hookspecs + interfaces); plugins declare a range over it.
API_VERSION = "1.0"
PLATFORM_GROUP = "hwplug.platforms"
PLUGIN_GROUP = "hwplug.plugins"
MODEL_GROUP = "hwplug.models"
BUILTIN_PLATFORM = "cpu"
BUILTIN_PLUGIN = "hwplug.builtin"

REGISTRATION_HOOKS = (
    "hwplug_register_attention_backends",
    "hwplug_register_kernels",
    "hwplug_register_quant_methods",
    "hwplug_register_connectors",
    "hwplug_register_models",
)


@dataclass
class PluginRecord:
    """What happened to one entry point: ``loaded``, ``skipped`` or ``failed``."""

    name: str
    group: str
    value: str
    distribution: str | None
    version: str | None
    status: str = "pending"
    reason: str = ""
    traceback: str | None = None


@dataclass
class Candidate:
    """A platform that was asked whether its hardware is present."""

    name: str
    source: str  # distribution name, or "hwplug" for the built-in CPU platform
    status: str  # "active", "inactive", "unavailable", "failed", "not probed"
    reason: str = ""
    platform_cls: type | None = None
    traceback: str | None = None
    #: The instance made to ask ``is_available()``, reused if this candidate is chosen.
    platform: Any = None

    def rank(self) -> tuple[bool, bool, int]:
        cls = self.platform_cls
        return (cls.is_accelerator, self.source != "hwplug", cls.priority) if cls else (
            False, False, -(10**9))


@dataclass
class Resolution:
    """The outcome of discovery, as ``hwplug info`` reports it."""

    platform: Any
    reason: str
    forced: bool
    candidates: list[Candidate] = field(default_factory=list)
    plugins: list[PluginRecord] = field(default_factory=list)
    sightings: list[Any] = field(default_factory=list)  # hardware without its plugin


def entry_points(group: str) -> list[importlib_metadata.EntryPoint]:
    """The group's entry points, one per (name, value), in a stable order."""
    seen: dict[tuple[str, str], importlib_metadata.EntryPoint] = {}
    for ep in importlib_metadata.entry_points(group=group):
        seen.setdefault((ep.name, ep.value), ep)
    return sorted(seen.values(), key=lambda ep: ep.name)


def _record(ep: importlib_metadata.EntryPoint, group: str) -> PluginRecord:
    dist = getattr(ep, "dist", None)
    return PluginRecord(ep.name, group, ep.value, dist.name if dist else None,
                        dist.version if dist else None)


def _allowed(name: str) -> bool:
    allow = envs.HWPLUG_PLUGINS
    return allow is None or name in allow


def _fail(record: PluginRecord | Candidate, message: str, exc: BaseException | None) -> None:
    record.status, record.reason = "failed", message
    record.traceback = "".join(traceback.format_exception(exc)) if exc else None
    logger.warning("%s: %s", record.name, message)
    if envs.HWPLUG_STRICT_PLUGINS:
        raise PluginError(f"{record.name}: {message} (HWPLUG_STRICT_PLUGINS is set)") from exc


# --- platforms -------------------------------------------------------------------------

def _probe(ep: importlib_metadata.EntryPoint) -> Candidate:
    dist = getattr(ep, "dist", None)
    candidate = Candidate(ep.name, dist.name if dist else "?", "inactive")
    try:
        target = ep.load()()
    except Exception as exc:
        _fail(candidate, f"probe raised {exc!r}", exc)
        return candidate
    if target is None:
        candidate.reason = "probe saw no hardware"
        return candidate
    try:
        candidate.platform_cls = import_object(target) if isinstance(target, str) else target
    except Exception as exc:
        _fail(candidate, f"platform class {target!r} failed to import: {exc!r}", exc)
        return candidate
    candidate.status = "active"
    return candidate


def _builtin_candidate() -> Candidate:
    from hwplug.platforms.cpu import CpuPlatform

    return Candidate(BUILTIN_PLATFORM, "hwplug", "active", "",
                     CpuPlatform)


def _forced_candidate(name: str, eps: list[importlib_metadata.EntryPoint]) -> Candidate:
    by_name = {ep.name: ep for ep in eps}
    if name == BUILTIN_PLATFORM and name not in by_name:
        return _builtin_candidate()
    installed = sorted({BUILTIN_PLATFORM, *by_name})
    if name not in by_name:
        raise PlatformError(
            f"HWPLUG_PLATFORM={name!r} names no installed platform; installed: "
            f"{', '.join(installed)}" + _install_hint(name))
    try:
        candidate = _probe(by_name[name])
    except PluginError as exc:  # strict mode; a forced platform fails either way
        raise PlatformError(f"HWPLUG_PLATFORM={name!r}: {exc}") from exc
    if candidate.status != "active":
        raise PlatformError(f"HWPLUG_PLATFORM={name!r} was forced but its probe failed: "
                            f"{candidate.reason}; installed: {', '.join(installed)}")
    candidate.reason = "forced by HWPLUG_PLATFORM"
    return candidate


def _install_hint(name: str) -> str:
    from hwplug.platforms.probes import ALL_PROBES, KNOWN_PLUGINS

    extra = KNOWN_PLUGINS.get(name)
    return f" (install it with: pip install \"hwplug[{extra}]\")" if extra else (
        f"; known hardware kinds: {', '.join(ALL_PROBES)}")


def _resolve_platform(eps: list[importlib_metadata.EntryPoint]) -> tuple[Candidate, list[Candidate]]:
    forced = envs.HWPLUG_PLATFORM
    if forced:
        chosen = _forced_candidate(forced, eps)
        others = [Candidate(ep.name, "?", "not probed", "a platform was forced")
                  for ep in eps if ep.name != forced]
        return chosen, others
    candidates = [_probe(ep) for ep in eps]
    if BUILTIN_PLATFORM not in {c.name for c in candidates if c.status == "active"}:
        candidates.append(_builtin_candidate())
    ranked = sorted((c for c in candidates if c.status == "active"), key=Candidate.rank,
                    reverse=True)
    chosen = next(c for c in ranked if _usable(c))  # the built-in CPU always is
    active = ranked[ranked.index(chosen):]
    chosen.reason = chosen.reason or _why_chosen(chosen, active[1:])
    for other in active[1:]:
        other.reason = f"ranked below {chosen.name}" + (
            " (an accelerator)" if chosen.rank()[0] and not other.rank()[0] else "")
    return chosen, [c for c in candidates if c is not chosen]


def _usable(candidate: Candidate) -> bool:
    """An accelerator whose probe saw hardware must also be usable from this process
    (``is_available()``, which may import torch): a torch built without that device's
    support cannot drive it. CPU platforms are always usable. Only asked in rank order
    until one is usable, so a lower-ranked runtime is never imported for nothing."""
    if not candidate.rank()[0]:
        return True
    try:
        candidate.platform = candidate.platform_cls()
        available = candidate.platform.is_available()
    except Exception as exc:
        _fail(candidate, f"is_available() raised {exc!r}", exc)
        return False
    if not available:
        candidate.status = "unavailable"
        candidate.reason = ("its probe saw the hardware, but is_available() is False in this "
                            "process (e.g. torch was built without support for it)")
        logger.info("platform %s skipped: %s", candidate.name, candidate.reason)
    return available


def _why_chosen(chosen: Candidate, runners_up: list[Candidate]) -> str:
    kind = "accelerator" if chosen.rank()[0] else "CPU platform"
    if not runners_up:
        return f"the only active platform ({kind})"
    return f"highest-ranked active {kind} of {len(runners_up) + 1}"


# --- plugins ---------------------------------------------------------------------------

def _plugin_order(loaded: list[tuple[PluginRecord, Any]]) -> list[tuple[PluginRecord, Any]]:
    """Topological order over ``hwplug_requires``, then ``hwplug_order``, then name."""
    by_name = {record.name: (record, module) for record, module in loaded}
    ordered: list[tuple[PluginRecord, Any]] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> bool:
        if state.get(name) == "done":
            return True
        record, module = by_name[name]
        if name in chain:
            _fail(record, f"circular hwplug_requires: {' -> '.join((*chain, name))}", None)
            return False
        for needed in getattr(module, "hwplug_requires", ()):
            if needed not in by_name or not visit(needed, (*chain, name)):
                if record.status != "failed":
                    _fail(record, f"requires plugin {needed!r}, which is not loaded", None)
                return False
        state[name] = "done"
        ordered.append((record, module))
        return True

    key = lambda item: (getattr(item[1], "hwplug_order", 0), item[0].name)  # noqa: E731
    for record, _ in sorted(loaded, key=key):
        visit(record.name, ())
    return ordered


def _check_api(record: PluginRecord, module: Any) -> bool:
    declared = getattr(module, "hwplug_api_version", None)
    if declared is None:
        record.reason = "declares no hwplug_api_version; assumed compatible"
        return True
    try:
        ok = Version(API_VERSION) in SpecifierSet(str(declared))
    except InvalidSpecifier:
        ok = False
    if not ok:
        record.status = "skipped"
        record.reason = (f"built for hwplug API {declared}, this hwplug provides API "
                         f"{API_VERSION}")
        logger.warning("plugin %s skipped: %s", record.name, record.reason)
        if envs.HWPLUG_STRICT_PLUGINS:
            raise PluginError(f"{record.name}: {record.reason}")
    return ok


def _import_plugins(chosen: Candidate, platform_eps: list[importlib_metadata.EntryPoint],
                    records: list[PluginRecord]) -> list[tuple[PluginRecord, Any]]:
    other_platform_dists = {
        ep.dist.name for ep in platform_eps
        if getattr(ep, "dist", None) and ep.name != chosen.name
    } if envs.HWPLUG_PLATFORM else set()
    loaded = []
    for ep in entry_points(PLUGIN_GROUP):
        record = _record(ep, PLUGIN_GROUP)
        records.append(record)
        if not _allowed(ep.name):
            record.status, record.reason = "skipped", "not in HWPLUG_PLUGINS"
            continue
        if record.distribution in other_platform_dists:
            record.status = "skipped"
            record.reason = f"not imported: HWPLUG_PLATFORM forces {chosen.name!r}"
            continue
        try:
            module = ep.load()
        except Exception as exc:
            _fail(record, f"import failed: {exc!r}", exc)
            continue
        if _check_api(record, module):
            loaded.append((record, module))
    return loaded


class PluginHost:
    """Holds the pluggy manager and calls hooks one plugin at a time, isolating failures."""

    def __init__(self, kernel_registry: Registry[Any]) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.registries: dict[str, Registry[Any]] = {
            "hwplug_register_attention_backends": registries.attention_backends,
            "hwplug_register_kernels": kernel_registry,
            "hwplug_register_quant_methods": registries.quant_methods,
            "hwplug_register_connectors": registries.connectors,
            "hwplug_register_models": registries.models,
        }

    def add(self, record: PluginRecord, module: Any) -> bool:
        try:
            self.pm.register(module, name=record.name)
            self._check_names(module)
        except Exception as exc:
            if self.pm.is_registered(module):
                self.pm.unregister(module)
            _fail(record, f"invalid hook implementation: {exc}", exc)
            return False
        return True

    def _check_names(self, module: Any) -> None:
        """A ``hwplug_*`` hook implementation with no hookspec is a typo, not a new hook."""
        for hook in self.pm.get_hookcallers(module) or []:
            if not hook.has_spec():
                raise pluggy.PluginValidationError(
                    module, f"unknown hook {hook.name!r}; hooks: "
                    f"{', '.join(REGISTRATION_HOOKS)}, hwplug_platform_resolved")

    def call(self, record: PluginRecord, module: Any, hook_name: str, **kwargs: Any) -> bool:
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            if impl.plugin is not module:
                continue
            token = current_source.set(record.name)
            try:
                impl.function(**kwargs)
            except Exception as exc:
                self.drop(record)
                _fail(record, f"{hook_name} raised {exc!r}", exc)
                return False
            finally:
                current_source.reset(token)
        return True

    def drop(self, record: PluginRecord) -> None:
        for registry in self.registries.values():
            registry.drop_source(record.name)
        plugin = self.pm.get_plugin(record.name)
        if plugin is not None:
            self.pm.unregister(plugin)


def _run_plugins(platform: Any, loaded: list[tuple[PluginRecord, Any]]) -> None:
    from hwplug.kernel_registry import kernels

    host = PluginHost(kernels)
    ordered = [(r, m) for r, m in _plugin_order(loaded) if r.status != "failed"]
    alive = [(r, m) for r, m in ordered if host.add(r, m)]
    for hook_name in REGISTRATION_HOOKS:
        alive = [(r, m) for r, m in alive
                 if host.call(r, m, hook_name, registry=host.registries[hook_name])]
    for record, module in alive:
        if host.call(record, module, "hwplug_platform_resolved", platform=platform):
            record.status = "loaded"


def _builtin_loaded() -> tuple[PluginRecord, Any]:
    from hwplug import builtin_plugin

    record = PluginRecord(BUILTIN_PLUGIN, PLUGIN_GROUP, "hwplug.builtin_plugin", "hwplug",
                          API_VERSION, reason="built in")
    return record, builtin_plugin


def _orphan_sightings(installed: Iterable[str], root: Path) -> list[Any]:
    from hwplug.platforms.probes import probe_all

    names = set(installed)
    return [s for s in probe_all(root) if s.device_kind not in names]


def discover(root: Path = Path("/")) -> Resolution:
    """Resolve the platform and load every plugin (uncached; see :func:`current_platform`)."""
    envs.effective()  # an invalid HWPLUG_* value fails here, before anything is imported
    envs.warn_unknown()
    platform_eps = [ep for ep in entry_points(PLATFORM_GROUP) if _allowed(ep.name)]
    chosen, others = _resolve_platform(platform_eps)
    platform = chosen.platform or chosen.platform_cls()
    records: list[PluginRecord] = []
    loaded = [_builtin_loaded(), *_import_plugins(chosen, platform_eps, records)]
    records.insert(0, loaded[0][0])
    _run_plugins(platform, loaded)
    _register_model_entry_points()
    installed = {BUILTIN_PLATFORM, *(ep.name for ep in entry_points(PLATFORM_GROUP))}
    sightings = _orphan_sightings(installed, root)
    for sighting in sightings:
        logger.info("%s hardware seen but no plugin installed: %s", sighting.vendor,
                    sighting.install_hint)
    logger.info("platform %s chosen: %s", chosen.name, chosen.reason)
    return Resolution(platform, chosen.reason, bool(envs.HWPLUG_PLATFORM),
                      [chosen, *others], records, sightings)


def _register_model_entry_points() -> None:
    for ep in entry_points(MODEL_GROUP):
        if ep.name not in registries.models:
            token = current_source.set(f"entry point {ep.value}")
            try:
                registries.models.register(ep.name, ep.value)
            finally:
                current_source.reset(token)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.resolution: Resolution | None = None


_state = _State()


def resolution() -> Resolution:
    """The process's discovery result, computed on first use."""
    with _state.lock:
        if _state.resolution is None:
            _state.resolution = discover()
        return _state.resolution


def current_platform() -> Any:
    """The resolved :class:`~hwplug.Platform` instance (discovers on first call)."""
    return resolution().platform


def reset() -> None:
    """Forget discovery and everything plugins registered (code registrations stay).

    Next :func:`current_platform` runs discovery again, e.g. after the environment
    changed. Meant for tests and long-lived tools.
    """
    from hwplug.kernel_registry import kernels

    with _state.lock:
        _state.resolution = None
        for registry in (registries.attention_backends, registries.quant_methods,
                         registries.connectors, registries.models, kernels):
            for entry in registry.entries():
                if entry.source != "code":
                    registry.drop_source(entry.source)

