"""The plugin under test: its entry points, what it registered and where its checks run.

A target is named by an entry-point name of group ``hwplug.platforms`` and/or
``hwplug.plugins`` (``cuda``), or by a distribution name (``hwplug-cuda``; ``hwplug`` is
hwplug's own platform and plugins), which takes every entry point the distribution
declares. Resolving a target runs discovery afresh, so whatever the plugin registers
through its hooks is in the registries, recorded under its entry-point names
(:attr:`hwplug.registry.Entry.source`), and its platform is the instance discovery made
with the probe's sighting.

Numerical checks run on the platform's device when this process can drive it. Otherwise
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
from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

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

    def serving(self, platforms: tuple[str, ...], notes: list[str]) -> Placement:
        """Where code declared for ``platforms`` (empty: any) is checked: here, unless this
        is a present platform that ``platforms`` does not serve (without a platform: the
        CPU, unless ``platforms`` name others only); then on CPU in their stead,
        simulating them (Triton kernels in its interpreter, noted in ``notes``)."""
        if self.simulating or not platforms:
            return self
        if (self.platform.matches(platforms) if self.platform is not None
                else self.device == "cpu" and "cpu" in platforms):
            return self
        enable_triton_interpreter(notes)
        return Placement("cpu", None, "/".join(platforms))

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
    #: Registry sources of the target: its ``hwplug.plugins`` entry-point names (and
    #: ``"code"`` for hwplug itself, whose op references are registered in code).
    sources: frozenset[str]
    plugin_eps: list[importlib_metadata.EntryPoint]
    platform_ep: importlib_metadata.EntryPoint | None
    records: list[discovery.PluginRecord]
    platform: Platform | None
    placement: Placement
    notes: list[str] = field(default_factory=list)

    @property
    def is_hwplug(self) -> bool:
        """Whether the target is hwplug's own distribution."""
        return "code" in self.sources

    def plugin_modules(self) -> list[Any]:
        """The hook modules (imports them if discovery did not)."""
        return [ep.load() for ep in self.plugin_eps]


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


def _normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _entry_points(name: str) -> tuple[list[importlib_metadata.EntryPoint], bool]:
    """The entry points target ``name`` stands for, and whether it named a distribution."""
    groups = (discovery.PLATFORM_GROUP, discovery.PLUGIN_GROUP)
    eps = [ep for group in groups for ep in discovery.entry_points(group)]
    named = [ep for ep in eps if ep.name == name]
    if named:
        return named, False
    dist = [ep for ep in eps if _normalized(ep.dist.name if ep.dist else "") ==
            _normalized(name)]
    if dist:
        return dist, True
    choices = {ep.name for ep in eps} | {ep.dist.name for ep in eps if ep.dist}
    raise UnknownNameError("plugin", name, choices,
                           hint="Name an entry point of group hwplug.platforms or "
                                "hwplug.plugins, or the distribution declaring them")


def _platform(ep: importlib_metadata.EntryPoint, resolution: discovery.Resolution,
              notes: list[str]) -> tuple[Platform | None, bool]:
    """The platform discovery made for ``ep`` (with its sighting) and True; or, when its
    probe saw nothing, one made without a sighting from the class found in its package,
    and False."""
    candidate = next((c for c in resolution.candidates if c.name == ep.name), None)
    if candidate is not None and candidate.platform is not None:
        return candidate.platform, True
    if candidate is not None and candidate.status == "failed":
        notes.append(f"its probe failed: {candidate.reason}")
    enable_triton_interpreter(notes)
    cls = find_platform_class(ep, notes)
    return (cls() if cls is not None else None), False


def _placement(name: str, platform: Platform | None, present: bool,
               notes: list[str]) -> Placement:
    """On the platform's device when its hardware is present and usable; else on CPU,
    simulating it."""
    if platform is not None and present and platform.facts.available:
        return Placement(platform.device_type, platform)
    if present:
        notes.append(f"the probe saw {name} hardware but the runtime cannot use it")
    enable_triton_interpreter(notes)
    return Placement("cpu", None, name)


def resolve_target(name: str) -> Target:
    """Run discovery afresh and describe plugin ``name`` (an entry-point or distribution
    name) for the checks. Raises :class:`~hwplug.errors.UnknownNameError` listing the
    installed plugins and distributions when nothing has that name."""
    eps, by_distribution = _entry_points(name)
    discovery.reset()
    resolution = discovery.resolution()
    plugin_eps = [ep for ep in eps if ep.group == discovery.PLUGIN_GROUP]
    platform_ep = next((ep for ep in eps if ep.group == discovery.PLATFORM_GROUP), None)
    sources = {ep.name for ep in plugin_eps}
    if by_distribution and _normalized(name) == discovery.HWPLUG_DISTRIBUTION:
        sources.add("code")
    records = [r for r in resolution.plugins if r.name in sources]
    notes: list[str] = []
    platform = None
    if platform_ep is None:  # a plugin without a platform: checked on the resolved one
        placement = Placement(resolution.platform.device_type, resolution.platform)
    else:
        platform, present = _platform(platform_ep, resolution, notes)
        placement = _placement(platform_ep.name, platform, present, notes)
    return Target(name, frozenset(sources), plugin_eps, platform_ep, records, platform,
                  placement, notes)
