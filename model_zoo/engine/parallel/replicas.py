"""Data parallelism: engine replicas in spawned processes, fed a share of each generate call.

Replica 0 is the driver's own engine; :class:`Replicas` starts replicas 1..N-1, each a
full ``LLM`` built from the driver's options (sampling seed ``seed + i``) in its own
process (:func:`hwplug.model_zoo.workers.serve_replica`), bound to its CPUs of the
binding plan. A generate call's prompts are dealt round robin over the replicas, the turn
carrying on across calls (so one-prompt calls spread too), and the outputs come back in
request order. A replica
serves the calls it gets on threads of its own, so concurrent calls batch there as they
do in one engine. A replica that dies fails its pending calls with a
:class:`~hwplug.errors.WorkerError` naming it.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from hwplug.errors import EngineStoppedError, WorkerError
from hwplug.model_zoo.engine.output import Output
from hwplug.model_zoo.engine.parallel.binding import Plan
from hwplug.model_zoo.engine.parallel.processes import WorkerProcesses

logger = logging.getLogger(__name__)

#: Seconds replicas get to close their engines before they are terminated.
STOP_TIMEOUT = 30.0
MAX_SEED = 2**64
#: The program a replica's process runs (named: it builds an ``LLM``, a layer above this).
SERVE_REPLICA = "hwplug.model_zoo.workers:serve_replica"


class _Link:
    """The driver's end of one replica's pipe: calls out, replies in (a reader thread)."""

    def __init__(self, index: int, conn: Connection, processes: WorkerProcesses) -> None:
        self.index, self._conn, self._processes = index, conn, processes
        self.ready: Future[int] = Future()  # the replica's pid once its engine is built
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stopping = False
        self._failure: BaseException | None = None  # why the replica went, once it has
        threading.Thread(target=self._read, daemon=True,
                         name=f"hwplug-replica-{index}-reader").start()

    def call(self, method: str, *args: Any) -> Future[Any]:
        """Have the replica's ``LLM`` run ``method(*args)``; its result, later."""
        future: Future[Any] = Future()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise EngineStoppedError(f"data-parallel replica {self.index} was stopped")
            call_id = next(self._ids)
            try:
                self._conn.send((call_id, method, args))
            except OSError:  # the replica went before its reader thread saw its pipe close
                self._failure = self._gone()
                raise self._failure from None
            self._pending[call_id] = future
        return future

    def stop(self) -> None:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                try:
                    self._conn.send(None)
                except OSError:  # already gone
                    pass

    def _gone(self) -> BaseException:
        """The error for calls once the replica's connection closed unasked: how its process
        ended, or that the connection closed."""
        return self._processes.failure() or WorkerError(
            f"data-parallel replica {self.index} closed its connection", rank=self.index)

    def _read(self) -> None:
        try:
            while True:
                call_id, ok, value = self._conn.recv()
                with self._lock:
                    future = self.ready if call_id is None else self._pending.pop(call_id)
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(WorkerError(
                        f"data-parallel replica {self.index} failed: {value}", rank=self.index,
                        pid=self._processes.pids.get(self.index)))
        except (EOFError, OSError):
            error: BaseException = EngineStoppedError(
                f"data-parallel replica {self.index} was stopped")
            if not self._stopping:
                error = self._gone()
            with self._lock:
                self._stopping = True
                self._failure = error
                waiting = [*self._pending.values(), self.ready]
                self._pending.clear()
            for future in waiting:
                if not future.done():
                    future.set_exception(error)


class Replicas:
    """Replicas 1..``count``-1 of an ``LLM``, in processes of their own."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.processes = WorkerProcesses("data-parallel replica")
        self._turn = itertools.count()
        self._links: list[_Link] = []

    def spawn(self, options: dict[str, Any], plan: Plan | None) -> None:
        """Start the replicas from ``options`` (keyword arguments), bound by ``plan``."""
        seed = options.get("seed")
        for index in range(1, self.count):
            conn = self.processes.spawn(
                index, SERVE_REPLICA,
                {**options, "seed": None if seed is None else (seed + index) % MAX_SEED},
                plan[index] if plan else None)
            self._links.append(_Link(index, conn, self.processes))

    def wait_ready(self) -> None:
        """Wait until every replica has built its engine (a :class:`WorkerError` names one
        that failed, with its error)."""
        for link in self._links:
            link.ready.result()

    def generate(self, prompts: Sequence[Any], params: Sequence[Any],
                 local: Callable[[list[int]], list[Output]]) -> list[Output]:
        """The outputs of ``prompts`` (each with its ``params``), in order: replica 0's
        share (indices into ``prompts``) through ``local``, the others' over their pipes."""
        owners = [next(self._turn) % self.count for _ in prompts]
        shares = {replica: [i for i, owner in enumerate(owners) if owner == replica]
                  for replica in range(self.count)}
        futures = {replica: self._links[replica - 1].call(
            "generate", [prompts[i] for i in share], [params[i] for i in share])
            for replica, share in shares.items() if replica and share}
        results: list[Output | None] = [None] * len(prompts)
        for i, output in zip(shares[0], local(shares[0]) if shares[0] else [], strict=True):
            results[i] = output
        for replica, future in futures.items():
            for i, output in zip(shares[replica], future.result(), strict=True):
                output.request_id = f"{output.request_id}@replica{replica}"
                results[i] = output
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Stop every replica (its engine closed, then its process reaped); idempotent."""
        for link in self._links:
            link.stop()
        self.processes.stop(STOP_TIMEOUT)
