"""Publishing KV events over ZeroMQ, for routers outside the process (needs ``pyzmq``:
``pip install "hwplug[kv-events]"``).

A :class:`ZmqEventPublisher` subscribes to an engine's
:class:`~hwplug.model_zoo.engine.kv_events.KVEventBus` and sends every step's batch from a
thread of its own (the engine never waits on the network) on a ``PUB`` socket bound to
``endpoint``, as a three-part message, like vLLM's publisher: the topic, an 8-byte
big-endian sequence number (a gap tells a subscriber it missed batches), and the batch as
JSON: ``{"ts": float, "events": [{"type": "BlockStored", "block_hashes": [...], ...}]}``
with each event's fields by name. :func:`decode_batch` reads one back.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import asdict
from typing import Any

from hwplug import checks
from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

logger = logging.getLogger(__name__)

DEFAULT_TOPIC = "kv-events"
_EVENT_TYPES = {cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared)}
_STOP = object()


def encode_batch(batch: KVEventBatch) -> bytes:
    """The JSON bytes of ``batch``."""
    events = [{"type": type(event).__name__, **asdict(event)} for event in batch.events]
    return json.dumps({"ts": batch.ts, "events": events}).encode()


def decode_batch(payload: bytes) -> KVEventBatch:
    """The batch :func:`encode_batch` wrote (extra keys come back as tuples)."""
    data = json.loads(payload)
    events = []
    for item in data["events"]:
        cls = _EVENT_TYPES[item.pop("type")]
        if "extra_keys" in item:
            item["extra_keys"] = [tuple(keys) for keys in item["extra_keys"]]
        events.append(cls(**item))
    return KVEventBatch(data["ts"], events)


class ZmqEventPublisher:
    """Sends KV event batches on a ZeroMQ ``PUB`` socket bound to ``endpoint``."""

    def __init__(self, endpoint: str, topic: str = DEFAULT_TOPIC) -> None:
        checks.zmq_endpoint()("endpoint", endpoint)
        try:
            import zmq
        except ImportError as exc:
            raise ConfigError("publishing KV events needs pyzmq: pip install "
                              "\"hwplug[kv-events]\"") from exc
        self.topic = topic.encode()
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.PUB)
        try:
            self._socket.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            raise ConfigError(f"cannot publish KV events on {endpoint!r}: {exc}") from exc
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sequence = 0
        self._thread = threading.Thread(target=self._run, name="hwplug-kv-events",
                                        daemon=True)
        self._thread.start()

    def __call__(self, batch: KVEventBatch) -> None:
        """Queue ``batch`` for sending (a :class:`KVEventBus` subscriber)."""
        self._queue.put(batch)

    def close(self) -> None:
        """Send what is queued, then close the socket."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        try:
            while (batch := self._queue.get()) is not _STOP:
                self._socket.send_multipart(
                    [self.topic, self._sequence.to_bytes(8, "big"), encode_batch(batch)])
                self._sequence += 1
        except Exception:
            logger.exception("publishing KV events on %s failed; no more are sent",
                             self.endpoint)
        finally:
            self._socket.close(linger=1000)
