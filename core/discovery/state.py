"""The process's one discovery result: computed on first use, kept, and reset on request.

Discovery is idempotent per process; a spawned worker process runs it again, so
registrations made by plugins are there in workers too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hwplug import envs, registries
from hwplug.discovery.entry_points import (
    BUILTIN_PLATFORM,
    PLATFORM_GROUP,
    allowed,
    distribution,
    entry_points,
    is_own,
    one_scan,
)
from hwplug.discovery.plugins import (
    PluginRecord,
    import_plugins,
    register_model_entry_points,
    run_plugins,
)
from hwplug.discovery.ranking import Candidate, resolve
from hwplug.discovery.watchdog import ProbeTimeout, within_time_limit

logger = logging.getLogger(__name__)


@dataclass
class Resolution:
    """The outcome of discovery, as ``hwplug info`` reports it."""

    platform: Any
    reason: str
    forced: bool
    candidates: list[Candidate] = field(default_factory=list)
    plugins: list[PluginRecord] = field(default_factory=list)
    sightings: list[Any] = field(default_factory=list)  # hardware without its plugin
    probe_root: Path = Path("/")
    #: device kind -> why its hardware probe (a kind without its plugin) gave no answer.
    probe_timeouts: dict[str, str] = field(default_factory=dict)


def _orphan_sightings(installed: Iterable[str], root: Path
                      ) -> tuple[list[Any], dict[str, str]]:
    """What hwplug's probes see under ``root`` of the device kinds no ``installed`` platform
    serves, and why each probe that did not answer within ``HWPLUG_PROBE_TIMEOUT`` did not
    (device kind -> message). An installed kind is not probed here: its platform's own
    probe ran (under the time limit) when ranking, or was not to run at all."""
    from hwplug.platforms.probes import ALL_PROBES, probe_all

    names = set(installed)
    sightings: list[Any] = []
    timeouts: dict[str, str] = {}
    for kind, probe in ALL_PROBES.items():
        if kind in names:
            continue
        try:
            sightings += within_time_limit(partial(probe_all, root, probes={kind: probe}),
                                           f"the {kind} hardware probe", None)
        except ProbeTimeout as exc:
            logger.warning("%s", exc)
            timeouts[kind] = str(exc)
    return sightings, timeouts


def discover(root: Path | None = None) -> Resolution:
    """Resolve the platform and load every plugin (uncached; see :func:`current_platform`).

    Probes read the OS under ``root`` (default: ``HWPLUG_PROBE_ROOT``, i.e. ``/``).
    """
    running, _state.thread.running = getattr(_state.thread, "running", False), True
    try:
        with one_scan():
            return _discover(root)
    finally:
        _state.thread.running = running


def _discover(root: Path | None) -> Resolution:
    envs.effective()  # an invalid HWPLUG_* value fails here, before anything is imported
    envs.warn_unknown()
    root = envs.HWPLUG_PROBE_ROOT if root is None else root
    all_platform_eps = entry_points(PLATFORM_GROUP)
    platform_eps = [ep for ep in all_platform_eps if allowed(ep)]
    chosen, others = resolve(platform_eps, root)
    rivals = ({distribution(ep)[0] for ep in platform_eps
               if ep.name != chosen.name and not is_own(ep)} if envs.HWPLUG_PLATFORM else ())
    records: list[PluginRecord] = []
    loaded = import_plugins(chosen.name, rivals, records)
    run_plugins(chosen.platform, loaded)
    register_model_entry_points()
    installed = {BUILTIN_PLATFORM, *(ep.name for ep in all_platform_eps)}
    sightings, probe_timeouts = _orphan_sightings(installed, root)
    for sighting in sightings:
        logger.info("%s hardware seen but no plugin installed: %s", sighting.vendor,
                    sighting.install_hint)
    logger.info("platform %s chosen: %s", chosen.name, chosen.reason)
    return Resolution(chosen.platform, chosen.reason, bool(envs.HWPLUG_PLATFORM),
                      [chosen, *others], records, sightings, root, probe_timeouts)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.resolution: Resolution | None = None
        #: ``.running``: whether discovery runs on this thread (its own registry reads).
        self.thread = threading.local()


_state = _State()


def fill_registries() -> None:
    """What a process registry runs before its first read (:data:`hwplug.registries.
    DISCOVERY`): discovery, once per process. Reads made by discovery itself, on its
    thread, see what is registered so far."""
    if not getattr(_state.thread, "running", False):
        resolution()


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

    The next :func:`current_platform` runs discovery again, e.g. after the environment
    changed. Meant for tests and long-lived tools.
    """
    with _state.lock:
        _state.resolution = None
        for registry in registries.every():
            registry.refill()  # code registrations stay; the next read discovers again
