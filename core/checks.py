"""Checks of user-given values: each takes ``(name, value)`` and returns the value to use,
or raises :class:`~hwplug.errors.ConfigError` naming the option, the valid range and what
was given.

A check is built once and applied wherever a value enters (an ``LLM`` option, a CLI
flag, an ``HWPLUG_*`` twin), so the same wrong value gets the same message everywhere.
``bool`` is not an integer and a string is not a number here: ``True`` for a block size
or ``"8"`` for a count is a type error, never silently converted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any

from hwplug.errors import ConfigError

#: ``check(name, value) -> the value to use``; raises :class:`ConfigError`.
Check = Callable[[str, Any], Any]
#: The largest seed a ``torch.Generator`` takes.
MAX_SEED = 2**64 - 1


def describe(value: Any) -> str:
    """``value``'s type and the start of its repr, for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def is_integer(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _range_text(low: int | None, high: int | None) -> str:
    if high is None:
        return f">= {low}"
    top = "2**64 - 1" if high == MAX_SEED else str(high)
    return f"in [{low}, {top}]" if low is not None else f"<= {top}"


def integer(low: int | None = None, high: int | None = None, *,
            none: str | None = None) -> Check:
    """An integer in ``[low, high]``; with ``none``, also None (``none`` says what None
    means, e.g. "the platform's choice")."""
    wanted = f"an integer {_range_text(low, high)}"
    if none is not None:
        wanted = f"None ({none}) or {wanted}"

    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if (not is_integer(value) or (low is not None and value < low)
                or (high is not None and value > high)):
            raise ConfigError(f"{name} must be {wanted}, got {value!r}")
        return int(value)
    return check


def boolean(name: str, value: Any) -> bool:
    """True or False (not 1, 0 or a string)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {describe(value)}")
    return value


def choice(choices: tuple[str, ...], *, none: str | None = None) -> Check:
    """One of ``choices`` (strings); with ``none``, also None (``none`` says what it means)."""
    listed = ", ".join(choices)

    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if not isinstance(value, str) or value not in choices:
            extra = f" or None ({none})" if none is not None else ""
            raise ConfigError(f"{name} must be one of {listed}{extra}, got {value!r}")
        return value
    return check


def text(*, none: str | None = None) -> Check:
    """A non-empty string without NUL bytes; with ``none``, also None."""
    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            extra = f" or None ({none})" if none is not None else ""
            raise ConfigError(f"{name} must be a non-empty string{extra}, got "
                              f"{describe(value)}")
        return value
    return check


def real(low: float | None = None, high: float | None = None, *, low_open: bool = False,
         none: str | None = None) -> Check:
    """A finite real number (an int or a float, not a bool or a string) in ``[low, high]``
    (``(low, high]`` with ``low_open``); with ``none``, also None."""
    bounds = [f"{'>' if low_open else '>='} {low}" if low is not None else "",
              f"<= {high}" if high is not None else ""]
    wanted = " and ".join(b for b in bounds if b)
    wanted = f"a finite number{' ' + wanted if wanted else ''}"
    if none is not None:
        wanted = f"None ({none}) or {wanted}"

    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if (not isinstance(value, Real) or isinstance(value, bool)
                or not math.isfinite(value)
                or (low is not None and (value <= low if low_open else value < low))
                or (high is not None and value > high)):
            raise ConfigError(f"{name} must be {wanted}, got {describe(value)}")
        return value
    return check


def path(*, none: str | None = None) -> Check:
    """A file-system path: a non-empty ``str`` or ``os.PathLike`` without NUL bytes (as a
    ``str``); with ``none``, also None."""
    as_text = text(none=none)

    def check(name: str, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, bytes):
            raise ConfigError(f"{name} must be a path as text, got {describe(value)}")
        return as_text(name, value)
    return check


def fraction_or_count(name: str, value: Any) -> Any:
    """None, an integer >= 1 (a count) or a real number in (0, 1) (a fraction)."""
    if value is None:
        return None
    if is_integer(value):
        if value < 1:
            raise ConfigError(f"{name} must be >= 1 (a block count) or a fraction in (0, 1), "
                              f"got {value}")
        return int(value)
    if isinstance(value, Real) and not isinstance(value, bool):
        if not (math.isfinite(value) and 0 < value < 1):
            raise ConfigError(f"{name} as a fraction of free memory must be in (0, 1), "
                              f"got {value}")
        return float(value)
    raise ConfigError(f"{name} must be None, a block count or a fraction in (0, 1), "
                      f"got {value!r}")


def mapping(*, none: str | None = None) -> Check:
    """A mapping with string keys (copied into a dict); with ``none``, also None."""
    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise ConfigError(f"{name} must be a mapping of option names to values, got "
                              f"{describe(value)}")
        return dict(value)
    return check


#: ZeroMQ transports :func:`zmq_endpoint` accepts (those a ``PUB`` socket binds on).
ZMQ_TRANSPORTS = ("tcp", "ipc", "inproc")


def zmq_endpoint(*, none: str | None = None) -> Check:
    """A ZeroMQ endpoint to bind: ``tcp://HOST:PORT`` (``HOST`` an address, an interface
    name or ``*``, ``[...]`` around an IPv6 address; ``PORT`` in 1..65535, or ``*`` for one
    the system picks), ``ipc://PATH`` or ``inproc://NAME``; with ``none``, also None. zmq
    itself would bind a port above 65535 modulo 65536, and raise ``TypeError`` for an int."""
    def check(name: str, value: Any) -> Any:
        if value is None and none is not None:
            return None
        if not isinstance(value, str) or "\0" in value:
            raise ConfigError(f"{name} must be a ZeroMQ endpoint such as tcp://*:5557, got "
                              f"{describe(value)}")
        transport, sep, address = value.partition("://")
        if not sep or transport not in ZMQ_TRANSPORTS or not address.strip():
            raise ConfigError(f"{name} must be TRANSPORT://ADDRESS, the transport one of "
                              f"{', '.join(ZMQ_TRANSPORTS)} (e.g. tcp://*:5557), got {value!r}")
        host, colon, port = address.rpartition(":")
        if transport == "tcp" and not (
                colon and host and (port == "*" or (port.isdigit() and 0 < int(port) < 65536))):
            raise ConfigError(f"{name} must be tcp://HOST:PORT with a port in 1..65535 (or * "
                              f"for any free one), got {value!r}")
        return value
    return check
