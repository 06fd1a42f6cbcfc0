"""Loading plugins: import the ``hwplug.plugins`` entry points, check and order them, and
call their hooks through pluggy, one plugin at a time.

A plugin whose import fails, whose API range excludes :data:`API_VERSION`, whose hooks do
not match the hookspecs (pluggy's own validation) or whose hook raises is skipped: what it
registered is dropped and its traceback kept. Each hook implementation receives only
the arguments it names, as pluggy does. Plugins of other platforms' distributions are not
imported while ``HWPLUG_PLATFORM`` forces a platform; hwplug's own always are. An import
or hook still running after half of ``HWPLUG_PROBE_TIMEOUT`` is logged with how to skip the
plugin (:mod:`.watchdog`), and a third party's import still running at the full limit is
abandoned (the plugin is reported failed); what one changes of torch's process-global state (default
dtype, device, grad mode, threads) is put back, with a warning (:mod:`.torch_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import importlib_metadata
import pluggy
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from hwplug import envs, hookspecs, registries
from hwplug.discovery import torch_state
from hwplug.discovery.entry_points import (
    API_VERSION,
    MODEL_GROUP,
    PLUGIN_GROUP,
    allowed,
    distribution,
    entry_points,
    fail,
    is_own,
    isolated,
)
from hwplug.discovery.watchdog import ProbeTimeout, watchdog, within_time_limit
from hwplug.errors import PluginError
from hwplug.registry import current_source

logger = logging.getLogger(__name__)


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


Loaded = tuple[PluginRecord, Any]


def _record(ep: importlib_metadata.EntryPoint) -> PluginRecord:
    return PluginRecord(ep.name, PLUGIN_GROUP, ep.value, *distribution(ep))


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


def import_plugins(platform_name: str, other_platform_dists: Iterable[str],
                   records: list[PluginRecord]) -> list[Loaded]:
    """Import every allowed ``hwplug.plugins`` entry point, appending a record for each
    to ``records``; those of ``other_platform_dists`` (a forced platform's rivals) are
    skipped unimported."""
    skip = set(other_platform_dists)
    loaded = []
    for ep in entry_points(PLUGIN_GROUP):
        record = _record(ep)
        records.append(record)
        if not allowed(ep):
            record.status, record.reason = "skipped", "not in HWPLUG_PLUGINS"
            continue
        if record.distribution in skip and not is_own(ep):
            record.status = "skipped"
            record.reason = f"not imported: HWPLUG_PLATFORM forces {platform_name!r}"
            continue
        try:
            module = _import(ep)
        except ProbeTimeout as exc:
            fail(record, f"import abandoned: {exc}", None)
            continue
        except BaseException as exc:
            if not isolated(exc):
                raise
            fail(record, f"import failed: {exc!r}", exc)
            continue
        if is_own(ep):
            record.reason = "built in"
        if _check_api(record, module):
            loaded.append((record, module))
    return loaded


def _import(ep: importlib_metadata.EntryPoint) -> Any:
    """Import ``ep``'s module, torch's global state kept (:mod:`.torch_state`). A third
    party's import runs under the time limit: still running at ``HWPLUG_PROBE_TIMEOUT``,
    it is abandoned in its thread (:class:`ProbeTimeout`); hwplug's own run in this thread
    under the watchdog (they cannot be skipped)."""
    def load() -> Any:
        with torch_state.kept(ep.name, "import"):
            return ep.load()

    if not is_own(ep):
        return within_time_limit(load, f"importing plugin {ep.name}", ep.name)
    with watchdog(f"importing plugin {ep.name}", ep.name):
        return load()


def plugin_order(loaded: list[Loaded]) -> list[Loaded]:
    """Topological order over ``hwplug_requires``, then ``hwplug_order``, then name."""
    by_name = {record.name: (record, module) for record, module in loaded}
    ordered: list[Loaded] = []
    done: set[str] = set()

    def visit(name: str, chain: tuple[str, ...]) -> bool:
        if name in done:
            return True
        record, module = by_name[name]
        if name in chain:
            fail(record, f"circular hwplug_requires: {' -> '.join((*chain, name))}", None)
            return False
        for needed in getattr(module, "hwplug_requires", ()):
            if needed not in by_name or not visit(needed, (*chain, name)):
                if record.status != "failed":
                    fail(record, f"requires plugin {needed!r}, which is not loaded", None)
                return False
        done.add(name)
        ordered.append((record, module))
        return True

    key = lambda item: (getattr(item[1], "hwplug_order", 0), item[0].name)  # noqa: E731
    for record, _ in sorted(loaded, key=key):
        visit(record.name, ())
    return ordered


class PluginHost:
    """The pluggy manager of project ``"hwplug"``; calls one plugin's hooks at a time."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)

    def add(self, record: PluginRecord, module: Any) -> bool:
        """Register ``module``; pluggy rejects hook implementations without a hookspec or
        with arguments the hookspec lacks (the plugin is then marked failed)."""
        try:
            self.pm.register(module, name=record.name)
            self.pm.check_pending()
        except Exception as exc:
            if self.pm.has_plugin(record.name):
                self.pm.unregister(name=record.name)
            fail(record, f"invalid hook implementation: {exc}", exc)
            return False
        return True

    def call(self, record: PluginRecord, hook_name: str, **kwargs: Any) -> bool:
        """Call ``record``'s implementation of ``hook_name`` (if any) through pluggy; on an
        exception drop everything it registered and mark it failed."""
        others = [plugin for name, plugin in self.pm.list_name_plugin() if name != record.name]
        caller = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
        token = current_source.set(record.name)
        try:
            with watchdog(f"{hook_name} of plugin {record.name}", record.name), \
                    torch_state.kept(record.name, hook_name):
                caller(**kwargs)
        except BaseException as exc:
            if not isolated(exc):
                raise
            self.drop(record)
            fail(record, f"{hook_name} raised {exc!r}", exc)
            return False
        finally:
            current_source.reset(token)
        return True

    def drop(self, record: PluginRecord) -> None:
        """Remove everything ``record`` registered, and the plugin itself."""
        for registry in registries.every():
            registry.drop_source(record.name)
        if self.pm.has_plugin(record.name):
            self.pm.unregister(name=record.name)


def run_plugins(platform: Any, loaded: list[Loaded]) -> None:
    """Call every registration hook, then ``hwplug_platform_resolved``, plugin by plugin in
    :func:`plugin_order`; a plugin that got through all of them is ``loaded``."""
    host = PluginHost()
    ordered = [(r, m) for r, m in plugin_order(loaded) if r.status != "failed"]
    alive = [(r, m) for r, m in ordered if host.add(r, m)]
    for hook_name in registries.REGISTRATION_HOOKS:
        registry = registries.for_hook(hook_name)
        alive = [(r, m) for r, m in alive if host.call(r, hook_name, registry=registry)]
    for record, _ in alive:
        if host.call(record, "hwplug_platform_resolved", platform=platform):
            record.status = "loaded"


def register_model_entry_points() -> None:
    """Register each ``hwplug.models`` entry point (lazily) unless its name is taken."""
    for ep in entry_points(MODEL_GROUP):
        if ep.name not in registries.models:
            token = current_source.set(f"entry point {ep.value}")
            try:
                registries.models.register(ep.name, ep.value)
            finally:
                current_source.reset(token)
