"""Bounding plugin code that discovery runs: probes under a time limit, the rest watched.

Probes are cheap by contract, but one may still hang (a device node whose ``open``
blocks, a driver query that never returns), and so may a plugin's import or hook. None of
them may hang hwplug silently:

- :func:`within_time_limit` runs a probe, or a third-party plugin's import, in a daemon
  thread and waits at most ``HWPLUG_PROBE_TIMEOUT`` seconds; one still running then is
  reported failed with that reason (:class:`ProbeTimeout`), and discovery carries on
  without it (an abandoned import keeps its module's import lock: nothing imports that
  plugin again in this process).
- :func:`watchdog` guards a hook call, or an import of hwplug's own plugins, which run in
  the calling thread (a hook's registrations cannot be half undone from outside); when
  it is still running after half the time limit, a warning names it and says how to skip
  it (:func:`skip_hint`).

Threads, not processes: a probe's answer is a small object naming a class to import in
this process, and a process per probe would cost an interpreter start (tens of
milliseconds) on every machine for the rare hang. A thread cannot be killed: a timed-out
probe's thread stays blocked where it hangs until the process exits (as a daemon thread
it never delays the exit), and whatever it returns later is ignored. A module it was
importing stays locked, so code importing that module waits as long; the probe's plugin
should then be skipped, which the warning says how to do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from hwplug import envs
from hwplug.discovery.entry_points import PLATFORM_GROUP, PLUGIN_GROUP, entry_points, is_own

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ProbeTimeout(TimeoutError):
    """A probe did not answer within ``HWPLUG_PROBE_TIMEOUT``; the message says so."""


def skip_hint(name: str) -> str:
    """How to run without entry point ``name``: an ``HWPLUG_PLUGINS`` allow-list of every
    other installed plugin (hwplug's own entry points always load and cannot be skipped)."""
    eps = [ep for group in (PLATFORM_GROUP, PLUGIN_GROUP) for ep in entry_points(group)]
    if any(ep.name == name and is_own(ep) for ep in eps):
        return f"{name} is part of hwplug itself and cannot be skipped: please report this"
    others = sorted({ep.name for ep in eps if ep.name != name and not is_own(ep)})
    return (f"to skip it, allow only the other plugins: HWPLUG_PLUGINS="
            f"{','.join(others) or 'none'}")


@contextmanager
def watchdog(what: str, name: str) -> Iterator[None]:
    """Log a warning, once, if the block still runs after half of ``HWPLUG_PROBE_TIMEOUT``:
    ``what`` (e.g. ``"importing plugin acme"``) and how to skip entry point ``name``."""
    after = envs.HWPLUG_PROBE_TIMEOUT / 2
    timer = threading.Timer(after, _still_running, (what, after, name))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _how_to_skip(name: str | None) -> str:
    """``"; "`` and :func:`skip_hint` for entry point ``name``; nothing for None."""
    return f"; {skip_hint(name)}" if name is not None else ""


def _still_running(what: str, seconds: float, name: str | None) -> None:
    logger.warning("%s is still running after %.1f s%s", what, seconds, _how_to_skip(name))


def within_time_limit(call: Callable[[], T], what: str, name: str | None) -> T:
    """``call()`` run in a daemon thread: its result, or the exception it raised (any
    BaseException, e.g. ``SystemExit``), re-raised here. Logs like :func:`watchdog` at half
    of ``HWPLUG_PROBE_TIMEOUT``; raises :class:`ProbeTimeout` when ``call`` is still
    running at the full limit, leaving its thread behind. The messages name ``what`` and
    say how to skip entry point ``name`` (None: a probe no setting skips, no hint)."""
    limit = envs.HWPLUG_PROBE_TIMEOUT
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread, which decides
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"hwplug: {what}", daemon=True)
    thread.start()
    thread.join(limit / 2)
    if thread.is_alive():
        _still_running(what, limit / 2, name)
        thread.join(limit / 2)
    if thread.is_alive():
        raise ProbeTimeout(f"{what} did not answer within {limit:g} s (HWPLUG_PROBE_TIMEOUT) "
                           f"and was left running in a background thread{_how_to_skip(name)}")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
