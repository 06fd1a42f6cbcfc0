"""The plugin under test: its entry points, what it registered and where its checks run.

A target is named by an entry-point name of group ``hwplug.platforms`` and/or
``hwplug.plugins``; ``"cpu"`` and ``"hwplug"`` (when no plugin uses the name) mean the
built-in CPU platform with hwplug's own registrations. Resolving a target runs discovery
afresh, so whatever the plugin registers through its hooks is in the registries,
recorded under its entry-point name (:attr:`hwplug.registry.Entry.source`).

Numerical checks run on the platform's device when its hardware is present. Otherwise
they run on CPU in its stead ("simulating" it): the kit sets ``TRITON_INTERPRET=1``
before the plugin's kernel modules are imported, so Triton kernels run in Triton's
interpreter.
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Any

import importlib_metadata

from hwplug import discovery
from hwplug.errors import UnknownNameError
from hwplug.platform import Platform
from hwplug.registry import import_object

logger = logging.getLogger(__name__)

#: Names that mean hwplug's built-in platform and registrations (unless a plugin uses one).
BUILTIN_TARGETS = ("cpu", "hwplug")
#: Sources of built-in registrations: hwplug's own hooks, and code (the op references).
BUILTIN_SOURCES = frozenset({discovery.BUILTIN_PLUGIN, "code"})


#: dtypes a CPU simulation cannot judge, and why; they are checked on the hardware only.
SIMULATION_GAPS = {
    "bfloat16": "Triton's interpreter multiplies the raw bits of bfloat16 operands in tl.dot "
                "(triton 3.x)",
}


@dataclass(frozen=True)
class Placement:
    """Where numerical checks run: a torch ``device``; ``platform`` is the present platform
    whose gates (capability, toolkit) apply, or None; ``simulating`` names the platform
    whose hardware is absent and which the CPU stands in for."""

    device: str = "cpu"
    platform: Platform | None = None
    simulating: str | None = None

    def describe(self) -> str:
        """Short: ``"on cuda"`` or ``"on cpu, simulating cuda"``."""
        return f"on {self.device}" + (f", simulating {self.simulating}" if self.simulating
                                      else "")

    def judgeable(self, dtypes: list[str], notes: list[str]) -> list[str]:
        """``dtypes`` without the simulation's gaps; each gap dropped is noted in ``notes``."""
        gaps = [d for d in dtypes if self.simulating and d in SIMULATION_GAPS]
        notes += [f"{d} (not judged in simulation, see setup)" for d in gaps]
        return [d for d in dtypes if d not in gaps]

    def explain(self) -> str:
        """:meth:`describe` with what simulating means."""
        if not self.simulating:
            return self.describe()
        gaps = "; ".join(f"{d} is not judged: {why}" for d, why in SIMULATION_GAPS.items())
        return (f"{self.describe()}: its hardware is absent, so capability and toolkit gates "
                f"are not evaluated and Triton kernels run in Triton's interpreter; {gaps}")


@dataclass
class Target:
    """Everything the checks need to know about one plugin."""

    name: str
    sources: frozenset[str]
    plugin_ep: importlib_metadata.EntryPoint | None
    platform_ep: importlib_metadata.EntryPoint | None
    record: discovery.PluginRecord | None
    platform_cls: type[Platform] | None
    placement: Placement
    notes: list[str] = field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return discovery.BUILTIN_PLUGIN in self.sources

    def plugin_module(self) -> Any:
        """The hook module (imports it if discovery did not)."""
        if self.builtin:
            from hwplug import builtin_plugin

            return builtin_plugin
        return self.plugin_ep.load() if self.plugin_ep else None


def _named(group: str, name: str) -> importlib_metadata.EntryPoint | None:
    return next((ep for ep in discovery.entry_points(group) if ep.name == name), None)


def enable_triton_interpreter(notes: list[str]) -> None:
    """Set ``TRITON_INTERPRET=1`` unless set already.

    Triton reads it when ``@triton.jit`` decorates a kernel, so kernels defined before this
    call keep compiling for a GPU; that is noted when triton is already imported.
    """
    if os.environ.get("TRITON_INTERPRET"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    logger.info("hardware absent: Triton kernels will run in the interpreter (TRITON_INTERPRET=1)")
    if "triton" in sys.modules:
        notes.append("triton was imported before the kit set TRITON_INTERPRET=1; Triton "
                     "kernels defined before then do not run in the interpreter")


def find_platform_class(ep: importlib_metadata.EntryPoint,
                        notes: list[str]) -> type[Platform] | None:
    """The Platform subclass named like ``ep`` in the probe's top-level package.

    Used when the probe saw no hardware and so did not say which class it would load.
    Modules that fail to import are noted and skipped.
    """
    package = importlib.import_module(ep.module.partition(".")[0])
    for info in pkgutil.walk_packages(getattr(package, "__path__", []), package.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            notes.append(f"{info.name} failed to import: {exc!r}")
    found = [cls for cls in _subclasses(Platform)
             if cls.__module__.partition(".")[0] == package.__name__ and cls.name == ep.name]
    return found[0] if found else None


def _subclasses(cls: type) -> list[type]:
    direct = cls.__subclasses__()
    return direct + [sub for child in direct for sub in _subclasses(child)]


def _builtin_target(name: str) -> Target:
    from hwplug.platforms.cpu import CpuPlatform

    resolution = discovery.resolution()
    record = next(r for r in resolution.plugins if r.name == discovery.BUILTIN_PLUGIN)
    platform = resolution.platform if resolution.platform.name == CpuPlatform.name else (
        CpuPlatform())
    return Target(name, BUILTIN_SOURCES, None, None, record, CpuPlatform,
                  Placement("cpu", platform))


def _probe(ep: importlib_metadata.EntryPoint, notes: list[str]) -> Any:
    try:
        return ep.load()()
    except Exception as exc:
        notes.append(f"probe raised {exc!r}; checking as if its hardware were absent")
        return None


def resolve_target(name: str) -> Target:
    """Run discovery afresh and describe plugin ``name`` for the checks.

    Raises :class:`~hwplug.errors.UnknownNameError` listing the installed plugins when no
    entry point (and no built-in) has that name.
    """
    platform_ep = _named(discovery.PLATFORM_GROUP, name)
    plugin_ep = _named(discovery.PLUGIN_GROUP, name)
    discovery.reset()
    if platform_ep is None and plugin_ep is None:
        if name in BUILTIN_TARGETS:
            return _builtin_target(name)
        installed = {ep.name for group in (discovery.PLATFORM_GROUP, discovery.PLUGIN_GROUP)
                     for ep in discovery.entry_points(group)}
        raise UnknownNameError("plugin", name, installed | set(BUILTIN_TARGETS),
                               hint="Name an entry point of group hwplug.platforms or "
                                    "hwplug.plugins")
    notes: list[str] = []
    found = _probe(platform_ep, notes) if platform_ep else None
    if platform_ep and found is None:
        enable_triton_interpreter(notes)
    resolution = discovery.resolution()
    record = next((r for r in resolution.plugins
                   if r.name == name and r.group == discovery.PLUGIN_GROUP), None)
    platform_cls = _platform_class(platform_ep, found, notes) if platform_ep else None
    placement = _placement(resolution.platform, platform_cls, found is not None, notes)
    return Target(name, frozenset({name}), plugin_ep, platform_ep, record, platform_cls,
                  placement, notes)


def _platform_class(ep: importlib_metadata.EntryPoint, found: Any,
                    notes: list[str]) -> type[Platform] | None:
    """The class the probe named, or (hardware absent) the one found in its package."""
    if found is None:
        return find_platform_class(ep, notes)
    try:
        return import_object(found) if isinstance(found, str) else found
    except Exception as exc:
        notes.append(f"platform class {found!r} failed to import: {exc!r}")
        return None


def _placement(resolved: Platform, platform_cls: type[Platform] | None, present: bool,
               notes: list[str]) -> Placement:
    if platform_cls is None:  # a plugin without a platform: checked on the resolved one
        return Placement(resolved.device_type, resolved)
    if present:
        platform = resolved if resolved.name == platform_cls.name else platform_cls()
        if platform.is_available():
            return Placement(platform.device_type, platform)
        notes.append(f"the probe saw {platform_cls.name} hardware but the runtime cannot use it")
        enable_triton_interpreter(notes)
    return Placement("cpu", None, platform_cls.name)
