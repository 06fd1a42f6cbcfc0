"""Typed errors. Every error hwplug raises on bad input is one of these.

Each message names the problem and, where there is a closed set of valid
choices, lists them, so a user can fix the input without reading source.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BuildError", "ConfigError", "DuplicateNameError", "EngineStoppedError",
           "HwplugError", "ModelError", "PlatformError", "PluginError", "RemovedError",
           "RequestAbortedError", "UnknownNameError", "UnsupportedError", "WorkerError"]


class HwplugError(Exception):
    """Base class of every error hwplug raises on purpose."""


class ConfigError(HwplugError, ValueError):
    """An ``HWPLUG_*`` variable or a configuration value is invalid."""


class UnknownNameError(HwplugError, KeyError):
    """A name was looked up in a registry that does not hold it."""

    def __init__(self, kind: str, name: str, choices: Iterable[str], hint: str = "") -> None:
        self.kind, self.name, self.choices = kind, name, sorted(choices)
        listed = ", ".join(self.choices) if self.choices else "(none registered)"
        message = f"unknown {kind} {name!r}; registered: {listed}"
        super().__init__(message + (f". {hint}" if hint else ""))

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateNameError(HwplugError, ValueError):
    """A name is registered twice without ``override=True``."""


class RemovedError(HwplugError, LookupError):
    """A registered thing was removed; the message names its replacement."""


class PlatformError(HwplugError, RuntimeError):
    """A platform could not be resolved, forced, probed or used."""


class PluginError(HwplugError, RuntimeError):
    """A plugin failed to load or broke its contract (raised in strict mode)."""


class UnsupportedError(HwplugError, ValueError):
    """A backend, kernel or platform cannot serve the request; the message says why."""


class BuildError(UnsupportedError):
    """A native kernel library could not be built (no compiler, a failing compiler, an
    unwritable cache); the message names the library and the compiler's reason."""


class ModelError(HwplugError, ValueError):
    """A model could not be found, loaded or run with the given input."""


class EngineStoppedError(HwplugError, RuntimeError):
    """The engine was shut down (or one of its workers died) while a request waited."""


class WorkerError(HwplugError, RuntimeError):
    """A worker process of a parallel engine (a tensor-parallel rank or a data-parallel
    replica) died or failed; the message names it. ``rank`` is its rank (or replica index),
    ``pid`` its process id and ``exitcode`` its exit status (negative: the signal that
    killed it; None when unknown)."""

    def __init__(self, message: str, rank: int | None = None, pid: int | None = None,
                 exitcode: int | None = None) -> None:
        super().__init__(message)
        self.rank, self.pid, self.exitcode = rank, pid, exitcode


class RequestAbortedError(HwplugError, RuntimeError):
    """The request was aborted (its stream closed) before it finished."""
