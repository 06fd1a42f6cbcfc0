"""Entry-point plumbing shared by platform ranking and plugin loading.

hwplug's own distribution declares entry points too (the built-in ``cpu`` platform and
hwplug's own plugins); those are always loaded, whatever ``HWPLUG_PLUGINS`` or
``HWPLUG_PLATFORM`` say, because the rest of hwplug stands on them.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import importlib_metadata

from hwplug import envs
from hwplug.errors import PluginError

logger = logging.getLogger(__name__)

#: Version of the plugin API (hookspecs + interfaces); plugins declare a range over it.
API_VERSION = "1.0"
PLATFORM_GROUP = "hwplug.platforms"
PLUGIN_GROUP = "hwplug.plugins"
MODEL_GROUP = "hwplug.models"
#: The distribution whose entry points are hwplug's own.
HWPLUG_DISTRIBUTION = "hwplug"
#: The built-in platform, the embedded default.
BUILTIN_PLATFORM = "cpu"


class Outcome(Protocol):
    """What :func:`fail` records a failure on (a platform candidate or a plugin record)."""

    name: str
    status: str
    reason: str
    traceback: str | None


class _Scan:
    """The installed distributions' entry points of every group, read once, and each
    declaring distribution's ``(name, version)`` as first asked for."""

    def __init__(self) -> None:
        self.entry_points = importlib_metadata.entry_points()
        #: id(distribution) -> (the distribution, kept alive so its id stays its own,
        #: its (name, version))
        self.distributions: dict[int, tuple[object, tuple[str | None, str | None]]] = {}


_scan: _Scan | None = None


@contextmanager
def one_scan() -> Iterator[None]:
    """Within the block, :func:`entry_points` answers every group from one read of the
    installed distributions, and :func:`distribution` reads each distribution's metadata
    once: outside it each call reads the files again, and discovery asks for three groups
    and for the distribution of every entry point (20-30 ms of a start with hwplug's six
    plugin distributions installed, each metadata file parsed as an email message).
    Distributions installed meanwhile are not seen until the block ends. Nested blocks
    share the outermost one's scan."""
    global _scan
    if _scan is not None:
        yield
        return
    _scan = _Scan()
    try:
        yield
    finally:
        _scan = None


def entry_points(group: str) -> list[importlib_metadata.EntryPoint]:
    """The group's entry points, one per (name, value), in a stable order."""
    scan = _scan
    found = (scan.entry_points.select(group=group) if scan is not None
             else importlib_metadata.entry_points(group=group))
    seen: dict[tuple[str, str], importlib_metadata.EntryPoint] = {}
    for ep in found:
        seen.setdefault((ep.name, ep.value), ep)
    return sorted(seen.values(), key=lambda ep: ep.name)


def distribution(ep: importlib_metadata.EntryPoint) -> tuple[str | None, str | None]:
    """``(name, version)`` of the distribution declaring ``ep`` (None when unknown)."""
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    scan = _scan
    if scan is not None and id(dist) in scan.distributions:
        return scan.distributions[id(dist)][1]
    metadata = dist.metadata  # parsed anew at each access
    known = metadata["Name"], metadata["Version"]
    if scan is not None:
        scan.distributions[id(dist)] = dist, known
    return known


def is_own(ep: importlib_metadata.EntryPoint) -> bool:
    """Whether ``ep`` is declared by hwplug itself."""
    return distribution(ep)[0] == HWPLUG_DISTRIBUTION


def allowed(ep: importlib_metadata.EntryPoint) -> bool:
    """hwplug's own entry points, and the others ``HWPLUG_PLUGINS`` allows (all if unset)."""
    allow = envs.HWPLUG_PLUGINS
    return allow is None or ep.name in allow or is_own(ep)


def fail(outcome: Outcome, message: str, exc: BaseException | None) -> None:
    """Mark ``outcome`` failed with ``message`` and ``exc``'s traceback; in strict mode
    (``HWPLUG_STRICT_PLUGINS``) raise :class:`PluginError` instead of carrying on."""
    outcome.status, outcome.reason = "failed", message
    outcome.traceback = "".join(traceback.format_exception(exc)) if exc else None
    logger.warning("%s: %s", outcome.name, message)
    if envs.HWPLUG_STRICT_PLUGINS:
        raise PluginError(f"{outcome.name}: {message} (HWPLUG_STRICT_PLUGINS is set)") from exc


def isolated(exc: BaseException) -> bool:
    """Whether a plugin's exception is contained (everything but KeyboardInterrupt: a
    plugin calling ``sys.exit`` must not end the process)."""
    return not isinstance(exc, KeyboardInterrupt)
