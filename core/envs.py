"""Every ``HWPLUG_*`` environment variable, declared once with type, default and help.

Read a value as an attribute (``hwplug.envs.HWPLUG_PLATFORM``); it is parsed from the
environment at each access, so tests and workers see changes. An invalid value raises
:class:`~hwplug.errors.ConfigError` naming the variable and the valid values. Variables
that were renamed are tombstones in :data:`RETIRED`: setting one warns with its
replacement, and its value is read for the replacement while that is unset. Any other
set ``HWPLUG_*`` variable that is not declared here is warned about by name (see
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
        env = os.environ if environ is None else environ
        name, raw = self.name, env.get(self.name)
        for old in _RENAMED_TO.get(self.name, ()):
            if (raw is None or not raw.strip()) and env.get(old, "").strip():
                name, raw = old, env[old]
        if raw is None or raw.strip() == "":
            return self.default
        if self.choices and raw.strip().lower() not in self.choices:
            raise ConfigError(
                f"{name}={raw!r} is not valid; choose one of: {', '.join(self.choices)}"
            )
        try:
            return self.parse(raw.strip())
        except ValueError as exc:
            raise ConfigError(f"{name}={raw!r} is not a valid {self.type_name}: {exc}") from None


@dataclass(frozen=True)
class Retired:
    """A variable hwplug no longer declares: ``replacement`` took its place (and reads its
    value while the replacement is unset); ``why`` says what changed."""

    name: str
    replacement: str
    why: str


def _flag(raw: str) -> bool:
    return raw.lower() in ("1", "true", "yes", "on")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value < 1e9:  # rejects NaN and infinity too
        raise ValueError(f"expected a number of seconds above 0 and below 1e9, got {raw!r}")
    return value


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
    EnvVar("HWPLUG_PROBE_TIMEOUT", "number of seconds", 10.0,
           "A platform probe or a plugin's import that has not finished within this time "
           "is abandoned and reported failed. A plugin import, probe or hook still running "
           "after half of it is logged, with how to skip it (HWPLUG_PLUGINS).", _seconds),
    EnvVar("HWPLUG_DISABLED_KERNELS", "comma-separated variant names", (),
           "Kernel variants never to select (see `hwplug kernels`).", _names),
    EnvVar("HWPLUG_PREFERRED_KERNELS", "op=variant[|variant],...", {},
           "Per-op preferred variant order, tried before the priority order.", _op_map),
    EnvVar("HWPLUG_STRICT_KERNELS", "flag", False,
           "Never fall back: if the best variant for a call cannot serve it, raise.", _flag,
           _FLAG_CHOICES),
    EnvVar("HWPLUG_BUILD_KERNELS", "auto | never", "auto",
           "When native kernel libraries (the CPU's C kernels) are compiled: auto builds one "
           "when a kernel variant needing it is first bound for calls; never runs no compiler "
           "at runtime, so only libraries built ahead of time by `hwplug build` serve.",
           str.lower, ("auto", "never")),
    EnvVar("HWPLUG_ATTENTION_BACKEND", "backend name", None,
           "Use this attention backend instead of the platform's priority list.", str),
    EnvVar("HWPLUG_RENDEZVOUS_TIMEOUT_S", "number of seconds", None,
           "How long the ranks of a tensor-parallel LLM wait for each other to join (the "
           "rendezvous_timeout_s option of every LLM not given one).", _seconds),
    EnvVar("HWPLUG_KV_CONNECTOR", "connector name", None,
           "The KV connector of every LLM (and hwplug generate / serve) not given one.", str),
    EnvVar("HWPLUG_KV_CONNECTOR_CONFIG", "JSON or @file", None,
           "The KV connector's options, as JSON text or @path of a file holding it.", str),
    EnvVar("HWPLUG_KV_LOAD_FAILURE_POLICY", "policy", None,
           "What a failed KV load does: fail the request or recompute the blocks.",
           str.lower, ("fail", "recompute")),
    EnvVar("HWPLUG_CACHE_DIR", "path", Path.home() / ".cache" / "hwplug",
           "Where converted tokenizers, dequantised weights and compiled kernel libraries "
           "(and their remembered build failures) are cached.", Path),
    EnvVar("HWPLUG_TUNING_DIR", "path", None,
           "Directory of user kernel tuning tables (JSON), layered over plugin defaults.", Path),
    EnvVar("HWPLUG_LOG_LEVEL", "log level", "warning",
           "Level of hwplug's loggers when the CLI configures logging.", str.lower, _LOG_LEVELS),
    EnvVar("HWPLUG_DEBUG", "flag", False,
           "The CLI prints the full traceback of an error, not just its one-line message.",
           _flag, _FLAG_CHOICES),
    EnvVar("HWPLUG_CPU_BIND", "auto | none | cpu lists per rank", "auto",
           "How CPU worker ranks bind their threads: auto (one NUMA node each), none, or each "
           "rank's CPUs separated by '|' (0-7|8-15).", str),
    EnvVar("HWPLUG_ALL2ALL_BACKEND", "all-to-all algorithm", None,
           "The all-to-all of expert parallelism (e.g. all_to_all, allgather_reducescatter); "
           "one the platform's communicator lacks warns once and uses its default.", str),
    EnvVar("HWPLUG_PROBE_ROOT", "path", Path("/"),
           "Directory the hardware probes read /proc, /sys and /dev under (a container's "
           "mount of the host, or a fake tree in tests).", Path),
]

VARIABLES: dict[str, EnvVar] = {var.name: var for var in _DECLARED}

#: Tombstones of renamed variables, by old name.
RETIRED: dict[str, Retired] = {r.name: r for r in (
    Retired("HWPLUG_KERNEL_PREFER", "HWPLUG_PREFERRED_KERNELS",
            "renamed to pair with HWPLUG_DISABLED_KERNELS"),
    Retired("HWPLUG_KERNEL_STRICT", "HWPLUG_STRICT_KERNELS",
            "renamed to pair with HWPLUG_STRICT_PLUGINS"),
)}
_RENAMED_TO: dict[str, tuple[str, ...]] = {
    new: tuple(r.name for r in RETIRED.values() if r.replacement == new)
    for new in {r.replacement for r in RETIRED.values()}}


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
    """Set ``HWPLUG_*`` names that are neither declared nor retired, each with close
    declared names."""
    env = os.environ if environ is None else environ
    return {
        name: difflib.get_close_matches(name, VARIABLES, n=2)
        for name in env
        if name.startswith(PREFIX) and name not in VARIABLES and name not in RETIRED
    }


def retired(environ: Mapping[str, str] | None = None) -> list[Retired]:
    """The tombstones of the retired variables that are set."""
    env = os.environ if environ is None else environ
    return [RETIRED[name] for name in env if name in RETIRED]


def warn_unknown(environ: Mapping[str, str] | None = None) -> None:
    """Log a warning for every set ``HWPLUG_*`` variable hwplug does not declare: a retired
    one names its replacement, an unknown one the closest declared names."""
    for old in retired(environ):
        logger.warning("environment variable %s is retired (%s); use %s instead (its value is "
                       "read for %s while that is unset)", old.name, old.why, old.replacement,
                       old.replacement)
    for name, close in unknown(environ).items():
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        logger.warning("environment variable %s is not used by hwplug%s", name, hint)


def __getattr__(name: str) -> Any:
    if name in VARIABLES:
        return VARIABLES[name].read()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
