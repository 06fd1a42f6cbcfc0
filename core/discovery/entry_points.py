"""Entry-point plumbing shared by platform ranking and plugin loading.

hwplug's own distribution declares entry points too (the built-in ``cpu`` platform and
hwplug's own plugins); those are always loaded, whatever ``HWPLUG_PLUGINS`` or
``HWPLUG_PLATFORM`` say, because the rest of hwplug stands on them.
"""

from __future__ import annotations

import logging
import traceback
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


def entry_points(group: str) -> list[importlib_metadata.EntryPoint]:
    """The group's entry points, one per (name, value), in a stable order."""
    seen: dict[tuple[str, str], importlib_metadata.EntryPoint] = {}
    for ep in importlib_metadata.entry_points(group=group):
        seen.setdefault((ep.name, ep.value), ep)
    return sorted(seen.values(), key=lambda ep: ep.name)


def distribution(ep: importlib_metadata.EntryPoint) -> tuple[str | None, str | None]:
    """``(name, version)`` of the distribution declaring ``ep`` (None when unknown)."""
    dist = getattr(ep, "dist", None)
    return (dist.name, dist.version) if dist is not None else (None, None)


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
