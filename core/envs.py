"""Every ``HWPLUG_*`` environment variable, declared once with type, default and help.

Read a value as an attribute (``hwplug.envs.HWPLUG_PLATFORM``); it is parsed from the
environment at each access, so tests and workers see changes. An invalid value raises
:class:`~hwplug.errors.ConfigError` naming the variable and the valid values. A set
``HWPLUG_*`` variable that is not declared here is warned about by name (see
:func:`warn_unknown`), never silently ignored.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwplug.errors import ConfigError

logger = logging.getLogger(__name__)

PREFIX = "HWPLUG_"


@dataclass(frozen=True)
class EnvVar:
    """One declared variable: how to parse it, its default and what it does."""

    name: str
    type_name: str
    default: Any
    help: str
    parse: Callable[[str], Any]
    choices: tuple[str, ...] = ()

    def read(self, environ: Mapping[str, str] | None = None) -> Any:
        raw = (os.environ if environ is None else environ).get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        if self.choices and raw.strip().lower() not in self.choices:
            raise ConfigError(
                f"{self.name}={raw!r} is not valid; choose one of: {', '.join(self.choices)}"
            )
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            raise ConfigError(f"{self.name}={raw!r} is not a valid {self.type_name}: {exc}") from None


def _flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _op_map(raw: str) -> dict[str, tuple[str, ...]]:
    """Parse ``op=variant[|variant...],op2=...`` into {op: (variant, ...)}."""
    result: dict[str, tuple[str, ...]] = {}
    for item in _names(raw):
        op, sep, variants = item.partition("=")
        if not sep or not op.strip() or not variants.strip():
            raise ValueError(f"expected op=variant[|variant...], got {item!r}")
        result[op.strip()] = tuple(v.strip() for v in variants.split("|") if v.strip())
    return result


_FLAG_CHOICES = ("0", "1", "true", "false", "yes", "no", "on", "off")
_LOG_LEVELS = ("debug", "info", "warning", "error")

_DECLARED = [
    EnvVar("HWPLUG_PLATFORM", "platform name", None,
           "Force this platform (e.g. cpu, cuda). A forced platform that is not installed or "
           "whose probe fails is an error; plugins of other platforms are not imported.", str),
    EnvVar("HWPLUG_PLUGINS", "comma-separated names", None,
           "Allow-list of plugin entry-point names; nothing else is imported.", _names),
    EnvVar("HWPLUG_STRICT_PLUGINS", "flag", False,
           "Turn a plugin that fails to load or raises in a hook into an error.", _flag,
           _FLAG_CHOICES),
    EnvVar("HWPLUG_DISABLED_KERNELS", "comma-separated variant names", (),
           "Kernel variants never to select (see `hwplug kernels`).", _names),
    EnvVar("HWPLUG_KERNEL_PREFER", "op=variant[|variant],...", {},
           "Per-op preferred variant order, tried before the priority order.", _op_map),
    EnvVar("HWPLUG_KERNEL_STRICT", "flag", False,
           "Never fall back: if the best variant for a call cannot serve it, raise.", _flag,
           _FLAG_CHOICES),
    EnvVar("HWPLUG_ATTENTION_BACKEND", "backend name", None,
           "Use this attention backend instead of the platform's priority list.", str),
    EnvVar("HWPLUG_CACHE_DIR", "path", Path.home() / ".cache" / "hwplug",
           "Where converted tokenizers and dequantised weights are cached.", Path),
    EnvVar("HWPLUG_TUNING_DIR", "path", None,
           "Directory of user kernel tuning tables (JSON), layered over plugin defaults.", Path),
    EnvVar("HWPLUG_LOG_LEVEL", "log level", "warning",
           "Level of hwplug's loggers when the CLI configures logging.", str.lower, _LOG_LEVELS),
]

VARIABLES: dict[str, EnvVar] = {var.name: var for var in _DECLARED}


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """Return the parsed value of the declared variable ``name``."""
    try:
        return VARIABLES[name].read(environ)
    except KeyError:
        raise ConfigError(f"{name} is not a declared hwplug variable; declared: "
                          f"{', '.join(VARIABLES)}") from None


def effective(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """All declared variables with their effective values (for ``hwplug info``)."""
    return {name: var.read(environ) for name, var in VARIABLES.items()}


def unknown(environ: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Set ``HWPLUG_*`` names that are not declared, each with close declared names."""
    env = os.environ if environ is None else environ
    return {
        name: difflib.get_close_matches(name, VARIABLES, n=2)
        for name in env
        if name.startswith(PREFIX) and name not in VARIABLES
    }


def warn_unknown(environ: Mapping[str, str] | None = None) -> None:
    """Log a warning for every set ``HWPLUG_*`` variable hwplug does not know."""
    for name, close in unknown(environ).items():
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        logger.warning("environment variable %s is not used by hwplug%s", name, hint)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return VARIABLES[name].read()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
