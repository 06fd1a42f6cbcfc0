"""Running a check body over hypothesis examples and returning the first failure.

Examples are derandomised (the same inputs on every run, so a report is reproducible),
not shrunk (kernels under a simulator are slow; the failure message already names the
shapes) and not stored in an example database.

On a simulated device (CPU standing in for absent hardware) an error that says the
*device* is missing is inconclusive ("not checked here") rather than a failure: a library
that is not installed at all, an op torch has no kernel for on this device
(``NotImplementedError``), or a ``RuntimeError`` / ``AssertionError`` raised inside torch
itself (e.g. ``torch.cuda`` without a GPU). Any other error, including a missing module of
an installed package, is the code's fault.
"""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from hwplug.conformance.result import Status

T = TypeVar("T")


class Failure(Exception):
    """Raised by a check body: the example failed; the message says how and where."""


class CannotRun(Exception):
    """Raised by a check body: the code needs hardware (or a device feature, a package)
    that this machine lacks; the check is "not checked here", not failed."""


def check_claimed_spec(backend: Any, spec: Any, label: str, platform: Any) -> None:
    """An attention backend's ``validate`` on a spec it claims: :class:`Failure` where it
    refuses the spec itself, :class:`CannotRun` where it refuses only ``platform`` (this
    machine's; None: not checked) for it."""
    reasons = backend.validate(spec)
    if reasons:
        raise Failure(f"validate refused a spec it claims ({label}): {'; '.join(reasons)}")
    device = [r for r in (backend.validate(spec, platform) if platform else ())
              if r not in reasons]
    if device:
        raise CannotRun(f"{platform.name} here: {'; '.join(device)}")


def first_failure(strategy: st.SearchStrategy[T], body: Callable[[T], None],
                  examples: int) -> BaseException | None:
    """Call ``body`` on up to ``examples`` drawn values; return what the first failing call
    raised (unwrapped from hypothesis' exception groups), or None if every call passed."""

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet)
    @given(strategy)
    def explore(value: T) -> None:
        body(value)

    try:
        explore()
    except Exception as exc:
        nested = getattr(exc, "exceptions", None)  # hypothesis' Flaky* groups wrap the error
        return nested[0] if nested else exc
    return None


def _needs_absent_device(exc: BaseException) -> bool:
    """Whether ``exc`` says the device (not the code under test) is missing."""
    if isinstance(exc, ModuleNotFoundError):
        top = (exc.name or "").partition(".")[0]
        return not top or importlib.util.find_spec(top) is None
    if isinstance(exc, (ImportError, NotImplementedError)):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return (isinstance(exc, (RuntimeError, AssertionError)) and bool(frames)
            and Path(frames[-1].filename).is_relative_to(_TORCH_DIR))


_TORCH_DIR = Path(torch.__file__).parent


def guarded(call: Callable[[], T], label: str, *, simulating: bool, what: str = "") -> T:
    """Run the code under test. An exception becomes :class:`CannotRun` when the device is
    simulated and the error says the device is missing, else a :class:`Failure`; the
    message names ``label`` (where) and, when given, ``what`` was being done."""
    try:
        return call()
    except Exception as exc:
        kind = CannotRun if simulating and _needs_absent_device(exc) else Failure
        raise kind(f"{what}{': ' if what else ''}raised {exc!r} at {label}") from exc


def judge(failure: BaseException | None, where: str) -> tuple[Status, str] | None:
    """The outcome of a :func:`first_failure` that found something, or None if it did not.

    Anything other than :class:`Failure` / :class:`CannotRun` is a bug of the kit or of
    the check body, and is re-raised.
    """
    if failure is None:
        return None
    if isinstance(failure, CannotRun):
        return "not checked", f"cannot run {where}: {failure}"
    if isinstance(failure, Failure):
        return "failed", f"{failure} ({where})"
    raise failure
