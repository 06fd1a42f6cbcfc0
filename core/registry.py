"""``Registry``: the one name -> object table behind every kind of registered thing.

Attention backends, quant methods, connectors, kernel variants and model architectures
are each kept in a ``Registry``. An entry holds an object or a lazy ``"module:attr"``
string imported on first :meth:`Registry.get`. Entries have a lifecycle: active,
deprecated (warns once, names the replacement; an old name kept for a renamed entry is a
deprecated *alias*) or removed (a tombstone whose lookup raises
:class:`~hwplug.errors.RemovedError` naming the replacement). Registries are
thread-safe and keep a ``version`` counter that changes on every mutation, so caches
built on them can tell when to rebuild.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from hwplug.errors import ConfigError, DuplicateNameError, RemovedError, UnknownNameError

logger = logging.getLogger(__name__)

T = TypeVar("T")
Status = Literal["active", "deprecated", "removed"]

#: Who is registering right now; set by plugin loading so entries record their plugin.
current_source: contextvars.ContextVar[str] = contextvars.ContextVar("hwplug_source",
                                                                     default="code")


def import_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` and return the attribute."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"expected 'module:attribute', got {path!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass
class Entry(Generic[T]):
    """One registered name. ``target`` is the object or its lazy ``module:attr`` path; an
    alias's target is the name it stands for."""

    name: str
    target: T | str
    source: str
    status: Status = "active"
    replacement: str | None = None
    warned: bool = False
    alias: bool = False

    @property
    def is_lazy(self) -> bool:
        return isinstance(self.target, str)


class Registry(Generic[T]):
    """A thread-safe table of named entries of one ``kind`` (e.g. "attention backend").

    ``filler`` names (``"module:function"``) what fills the registry; it runs once, before
    the first read (a lookup, a listing, ``in``), so a process registry is never read
    empty: hwplug's own are filled by discovery (:data:`hwplug.registries.DISCOVERY`).
    Registrations need no filler and never run it.
    """

    def __init__(self, kind: str, filler: str | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._lock = threading.RLock()
        self.version = 0
        self._filler = filler
        self._filled = filler is None

    def _fill(self) -> None:
        if not self._filled:
            import_object(self._filler)()  # type: ignore[arg-type]
            self._filled = True

    def refill(self, keep: str = "code") -> None:
        """Drop every entry not registered by source ``keep`` (by default, keep what code
        registered) and run the filler again before the next read (discovery reset)."""
        with self._lock:
            for source in {entry.source for entry in self._entries.values()} - {keep}:
                self.drop_source(source)
            self._filled = self._filler is None

    def register(self, name: str, target: T | str, *, override: bool = False) -> None:
        """Register ``target`` under ``name``; a second registration needs ``override=True``."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{self.kind} name must be a non-empty string, got {name!r}")
        source = current_source.get()
        with self._lock:
            old = self._entries.get(name)
            if old is not None and old.status != "removed":
                if not override:
                    raise DuplicateNameError(
                        f"{self.kind} {name!r} is already registered by {old.source}; "
                        "pass override=True to replace it"
                    )
                logger.info("%s %r from %s overridden by %s", self.kind, name, old.source, source)
            self._entries[name] = Entry(name, target, source)
            self._changed()

    def deprecate(self, name: str, replacement: str) -> None:
        """Keep ``name`` working but warn once per process that ``replacement`` supersedes it."""
        with self._lock:
            self._entry(name).status, self._entry(name).replacement = "deprecated", replacement
            self._changed()

    def alias(self, name: str, replacement: str) -> None:
        """Keep the old ``name`` of a renamed entry: looking it up warns once and returns
        ``replacement``'s object. Listings (:meth:`names`) leave aliases out."""
        with self._lock:
            self._entry(replacement)  # unknown -> lists the registered names
            self._entries[name] = Entry(name, replacement, current_source.get(), "deprecated",
                                        replacement, alias=True)
            self._changed()

    def remove(self, name: str, replacement: str | None = None) -> None:
        """Replace ``name`` by a tombstone: looking it up raises, naming ``replacement``."""
        with self._lock:
            source = self._entries[name].source if name in self._entries else current_source.get()
            self._entries[name] = Entry(name, "", source, "removed", replacement)
            self._changed()

    def drop_source(self, source: str) -> list[str]:
        """Remove every entry registered by ``source`` (a plugin that failed midway)."""
        with self._lock:
            dropped = [n for n, e in self._entries.items() if e.source == source]
            for name in dropped:
                del self._entries[name]
            if dropped:
                self._changed()
            return dropped

    def _changed(self) -> None:
        """Called under the lock after every mutation; subclasses drop derived caches."""
        self.version += 1

    def get(self, name: str) -> T:
        """The object registered as ``name``, importing a lazy entry on first use."""
        entry = self._entry(name)
        if entry.status == "removed":
            instead = f"; use {entry.replacement!r} instead" if entry.replacement else ""
            raise RemovedError(f"{self.kind} {name!r} was removed{instead}")
        if entry.status == "deprecated" and not entry.warned:
            entry.warned = True
            logger.warning("%s %r is deprecated; use %r instead", self.kind, name,
                           entry.replacement)
        if entry.alias:
            return self.get(str(entry.target))
        if entry.is_lazy:
            with self._lock:
                if isinstance(entry.target, str):
                    entry.target = import_object(entry.target)
        return entry.target  # type: ignore[return-value]

    def current_name(self, name: str) -> str:
        """``name``, or for a deprecated alias the name it stands for (warning once)."""
        self._fill()
        entry = self._entries.get(name)
        if entry is None or not entry.alias:
            return name
        self.get(name)  # the deprecation warning
        return str(entry.target)

    def entry(self, name: str) -> Entry[T]:
        """The raw entry (no import, no lifecycle check), for listings and explanations."""
        return self._entry(name)

    def _entry(self, name: str) -> Entry[T]:
        self._fill()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        """Names that can be looked up, aliases and removed names left out."""
        self._fill()
        with self._lock:
            return [n for n, e in self._entries.items()
                    if e.status != "removed" and not e.alias]

    def entries(self) -> list[Entry[T]]:
        self._fill()
        with self._lock:
            return list(self._entries.values())

    def __contains__(self, name: object) -> bool:
        self._fill()
        entry = self._entries.get(name) if isinstance(name, str) else None
        return entry is not None and entry.status != "removed"

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"
