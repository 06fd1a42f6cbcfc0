"""Probing and ranking platforms: which one this process runs on, and why.

Every allowed ``hwplug.platforms`` entry point is called with the probe root (when it takes
a ``root`` parameter), in a thread under ``HWPLUG_PROBE_TIMEOUT`` (:mod:`.watchdog`), and
answers an :class:`~hwplug.platforms.sighting.Activation`, a ``"module:Class"`` string, or
None; a probe that raises (even ``SystemExit``) or runs out of time is a failed candidate.
Each active candidate gets its platform instance, made with the probe's sighting.
Candidates are ranked by class (accelerators above CPUs, plugins above hwplug's own CPU
platform, then ``priority``; ties by name) and the first whose
:attr:`~hwplug.Platform.facts` say it is available in this process wins.
``HWPLUG_PLATFORM`` forces one instead; a forced platform that is not installed or whose
probe sees nothing is an error. Each probe runs once per discovery: where hwplug's own
``cpu`` entry point failed, the built-in CPU platform stands in without rerunning it.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import importlib_metadata

from hwplug import envs
from hwplug.discovery.entry_points import BUILTIN_PLATFORM, distribution, fail, isolated
from hwplug.discovery.watchdog import ProbeTimeout, watchdog, within_time_limit
from hwplug.errors import PlatformError, PluginError
from hwplug.platforms.sighting import Activation, Sighting
from hwplug.registry import import_object

logger = logging.getLogger(__name__)


@dataclass
class Candidate:
    """A platform that was asked whether its hardware is present."""

    name: str
    source: str  # the distribution that declares it ("hwplug" for the built-in CPU)
    status: str  # "active", "inactive", "unavailable", "failed", "not probed"
    reason: str = ""
    platform: Any = None  # the Platform instance, made with the probe's sighting
    traceback: str | None = None

    @property
    def platform_cls(self) -> type | None:
        return type(self.platform) if self.platform is not None else None

    def rank(self) -> tuple[bool, bool, int]:
        """Higher ranks first: accelerator, not hwplug's own, then ``priority``."""
        cls = self.platform_cls
        if cls is None:
            return False, False, -(10**9)
        return cls.is_accelerator, self.source != "hwplug", cls.priority


def call_activate(activate: Any, root: Path) -> Any:
    """Call a ``hwplug.platforms`` entry point's callable, passing ``root`` only if it
    takes one (or ``**kwargs``)."""
    try:
        params = inspect.signature(activate).parameters
    except (TypeError, ValueError):
        params = {}
    takes_root = "root" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    return activate(root=root) if takes_root else activate()


def _platform_of(answer: Any) -> tuple[type, Sighting | None]:
    """The platform class and sighting an entry point's non-None ``answer`` names."""
    if isinstance(answer, Activation):
        return import_object(answer.platform), answer.sighting
    if isinstance(answer, str):
        return import_object(answer), None
    raise PluginError(f"returned {answer!r}; expected an Activation, 'module:Class' or None")


def probe(ep: importlib_metadata.EntryPoint, root: Path) -> Candidate:
    """Ask entry point ``ep`` about the hardware under ``root``, within
    ``HWPLUG_PROBE_TIMEOUT`` (see :mod:`.watchdog`); never raises (but in strict mode)."""
    candidate = Candidate(ep.name, distribution(ep)[0] or "?", "inactive")
    try:
        answer = within_time_limit(lambda: call_activate(ep.load(), root),
                                   f"the probe of platform {ep.name}", ep.name)
    except ProbeTimeout as exc:
        fail(candidate, str(exc), None)
        return candidate
    except BaseException as exc:
        if not isolated(exc):
            raise
        fail(candidate, f"probe raised {exc!r}", exc)
        return candidate
    if answer is None:
        candidate.reason = "probe saw no hardware"
        return candidate
    try:
        with watchdog(f"loading the class of platform {ep.name}", ep.name):
            platform_cls, sighting = _platform_of(answer)
            candidate.platform = platform_cls(sighting)
    except BaseException as exc:
        if not isolated(exc):
            raise
        fail(candidate, f"platform {answer!r} failed to load: {exc!r}", exc)
        return candidate
    candidate.status = "active"
    return candidate


def builtin_candidate(root: Path, probed: bool = False) -> Candidate:
    """The built-in CPU platform, for when hwplug's own ``cpu`` entry point is missing or
    did not activate (``probed``: its probe ran and failed, and is not run again).

    Its probe runs here, under ``HWPLUG_PROBE_TIMEOUT``, only when the entry point's has
    not. A CPU is always there: a probe that failed or did not answer leaves the platform
    without a sighting (one device named ``cpu``, no features), never missing.
    """
    from hwplug.platforms.cpu.probe import PLATFORM_CLASS

    sighting = None if probed else _cpu_sighting(root)
    if sighting is None:
        logger.warning("the built-in CPU platform stands in without a sighting: its probe "
                       "failed or did not answer")
    return Candidate(BUILTIN_PLATFORM, "hwplug", "active", "",
                     import_object(PLATFORM_CLASS)(sighting))


def _cpu_sighting(root: Path) -> Sighting | None:
    """What the built-in CPU probe sees under ``root``, within ``HWPLUG_PROBE_TIMEOUT``;
    None (logged) when it does not answer in time."""
    from hwplug.platforms.cpu.probe import probe as probe_cpu

    try:
        return within_time_limit(lambda: probe_cpu(root),
                                 f"the probe of platform {BUILTIN_PLATFORM}", BUILTIN_PLATFORM)
    except ProbeTimeout as exc:
        logger.warning("%s", exc)
        return None


def _install_hint(name: str) -> str:
    from hwplug.platforms.probes import ALL_PROBES, KNOWN_PLUGINS

    extra = KNOWN_PLUGINS.get(name)
    return f" (install it with: pip install \"hwplug[{extra}]\")" if extra else (
        f"; known hardware kinds: {', '.join(ALL_PROBES)}")


def forced(name: str, eps: list[importlib_metadata.EntryPoint], root: Path) -> Candidate:
    """The candidate ``HWPLUG_PLATFORM`` names; :class:`PlatformError` when it is not
    installed or its probe does not activate."""
    by_name = {ep.name: ep for ep in eps}
    if name == BUILTIN_PLATFORM and name not in by_name:
        return builtin_candidate(root)
    installed = sorted({BUILTIN_PLATFORM, *by_name})
    if name not in by_name:
        raise PlatformError(
            f"HWPLUG_PLATFORM={name!r} names no installed platform; installed: "
            f"{', '.join(installed)}" + _install_hint(name))
    try:
        candidate = probe(by_name[name], root)
    except PluginError as exc:  # strict mode; a forced platform fails either way
        raise PlatformError(f"HWPLUG_PLATFORM={name!r}: {exc}") from exc
    if candidate.status != "active":
        raise PlatformError(f"HWPLUG_PLATFORM={name!r} was forced but its probe failed: "
                            f"{candidate.reason}; installed: {', '.join(installed)}")
    candidate.reason = "forced by HWPLUG_PLATFORM"
    if not candidate.platform.facts.available:
        candidate.reason += (" (is_available() is False in this process: only kernels that "
                             "run here, e.g. in Triton's interpreter, can serve it)")
    return candidate


def _available(candidate: Candidate) -> bool:
    """Whether the candidate's facts say this process can drive its device. Asked only
    in rank order until one is, so a lower-ranked runtime is never imported for nothing."""
    try:
        available = candidate.platform.facts.available
    except BaseException as exc:
        if not isolated(exc):
            raise
        fail(candidate, f"computing its facts raised {exc!r}", exc)
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
    reason = f"highest-ranked active {kind} of {len(runners_up) + 1}"
    tied = [c.name for c in runners_up if c.rank() == chosen.rank()]
    if tied:
        reason += (f"; tied in rank with {', '.join(tied)} and first by name: set "
                   f"HWPLUG_PLATFORM={tied[0]} to use {tied[0]}")
    return reason


def rank(eps: list[importlib_metadata.EntryPoint], root: Path
         ) -> tuple[Candidate, list[Candidate]]:
    """Probe every entry point and choose; returns (chosen, the other candidates)."""
    candidates = [probe(ep, root) for ep in eps]
    if BUILTIN_PLATFORM not in {c.name for c in candidates if c.status == "active"}:
        probed = any(c.name == BUILTIN_PLATFORM and c.source == "hwplug" for c in candidates)
        candidates.append(builtin_candidate(root, probed))
    ranked = sorted((c for c in candidates if c.status == "active"), key=Candidate.rank,
                    reverse=True)
    chosen = next((c for c in ranked if _available(c)), None)
    if chosen is None:
        raise PlatformError("no platform is available, not even the built-in CPU one")
    usable = [c for c in ranked[ranked.index(chosen) + 1:] if c.status == "active"]
    chosen.reason = chosen.reason or _why_chosen(chosen, usable)
    for other in usable:
        other.reason = f"ranked below {chosen.name}" + (
            " (an accelerator)" if chosen.rank()[0] and not other.rank()[0] else "")
    return chosen, [c for c in candidates if c is not chosen]


def resolve(eps: list[importlib_metadata.EntryPoint], root: Path
            ) -> tuple[Candidate, list[Candidate]]:
    """``HWPLUG_PLATFORM``'s platform, or the best-ranked one; (chosen, the others)."""
    name = envs.HWPLUG_PLATFORM
    if not name:
        return rank(eps, root)
    others = [Candidate(ep.name, distribution(ep)[0] or "?", "not probed",
                        "a platform was forced") for ep in eps if ep.name != name]
    return forced(name, eps, root), others
