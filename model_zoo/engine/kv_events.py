"""KV events: what the prefix cache stores and evicts, for routers and other observers.

The block manager records :class:`BlockStored` when full blocks enter the prefix cache
(their chained hashes, the parent hash of the first, their token ids, the block size and
each block's extra keys), :class:`BlockRemoved` when cached blocks are evicted, and
:class:`AllBlocksCleared` when the cache is reset (vLLM's event names and fields). The
engine delivers the events of each step, in order, as one :class:`KVEventBatch` to every
subscriber registered with :meth:`KVEventBus.subscribe` and to every publisher (see
:mod:`~hwplug.model_zoo.engine.zmq_events`). Callbacks run on the engine's thread: keep
them short; one that raises is logged and kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVEventBatch", "KVEventBus"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlockStored:
    """Consecutive full blocks of one sequence entered the prefix cache.

    ``block_hashes[i]`` names block i; ``parent_block_hash`` is the hash the first one
    chains from (the model's root hash for a sequence's first block); ``token_ids`` holds
    ``block_size`` tokens per block; ``extra_keys[i]`` are block i's extra hash inputs
    (e.g. a request's ``cache_salt`` on its first block).
    """

    block_hashes: list[str]
    parent_block_hash: str
    token_ids: list[int]
    block_size: int
    extra_keys: list[tuple[Any, ...]]
    medium: str = "device"


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks were evicted (their ids reused for other tokens)."""

    block_hashes: list[str]
    medium: str = "device"


@dataclass(frozen=True)
class AllBlocksCleared:
    """The whole prefix cache was dropped."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    """The events of one engine step, in the order they happened; ``ts`` in seconds since
    the epoch."""

    ts: float
    events: list[KVEvent] = field(default_factory=list)


class KVEventBus:
    """Collects events during a step and hands each step's batch to the subscribers."""

    def __init__(self) -> None:
        self._pending: list[KVEvent] = []
        self._subscribers: tuple[Callable[[KVEventBatch], None], ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, callback: Callable[[KVEventBatch], None]) -> Callable[[], None]:
        """Call ``callback(batch)`` after every step that had events; returns a function
        that unsubscribes it. Thread-safe."""
        with self._lock:
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not callback)

        return unsubscribe

    @property
    def active(self) -> bool:
        """Whether anyone listens (events are not even recorded otherwise)."""
        return bool(self._subscribers)

    def record(self, event: KVEvent) -> None:
        self._pending.append(event)

    def flush(self) -> None:
        """Deliver what was recorded since the last flush as one batch."""
        if not self._pending:
            return
        batch = KVEventBatch(time.time(), self._pending)
        self._pending = []
        for callback in self._subscribers:
            try:
                callback(batch)
            except Exception:
                logger.exception("KV event subscriber %r failed", callback)
