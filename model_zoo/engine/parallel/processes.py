"""Worker processes of a parallel engine: spawned, watched, and always reaped.

Workers start with the ``spawn`` method (a fresh interpreter: each reimports hwplug, so
discovery and every plugin's registrations run again there) as daemons, so a driver
that exits normally takes them with it. Each gets one end of a pipe (the other stays
here) for what its engine needs: a tensor-parallel rank reports why it failed on it, a
data-parallel replica serves requests over it. :meth:`WorkerProcesses.failure` names the
workers that died, with their pid and exit code or signal; :meth:`WorkerProcesses.stop`
waits for the workers to exit, then terminates and kills what is left.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from hwplug.errors import WorkerError
from hwplug.registry import import_object

logger = logging.getLogger(__name__)

#: Seconds :meth:`WorkerProcesses.failure` waits for a worker's death to be seen.
DEATH_WAIT = 5.0


@dataclass
class _Worker:
    rank: int
    process: BaseProcess
    conn: Connection


def describe_exit(exitcode: int | None) -> str:
    """``"was killed by signal SIGKILL"``, ``"exited with code 1"``, or still running."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def ignore_interrupts() -> None:
    """For a worker's first line: Ctrl-C reaches every process of the terminal's group, and
    the driver alone decides how its workers stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(target: str, *args: Any) -> None:
    """A worker process's entry: import the function ``target`` names and call it."""
    import_object(target)(*args)


class WorkerProcesses:
    """The spawned workers of one engine, each called a ``what`` (``"tensor-parallel
    rank"``) in messages. Thread-safe."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._context = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()

    def spawn(self, rank: int, target: str, *args: Any) -> Connection:
        """Start ``target(conn, *args)`` in a new daemon process; returns this side's end
        of ``conn``. ``target`` names a module-level function (``"module:function"``,
        imported in the new process); ``args`` must pickle."""
        here, there = self._context.Pipe()
        process = self._context.Process(target=_run, args=(target, there, *args), daemon=True,
                                        name=f"hwplug {self.what} {rank}")
        process.start()
        there.close()
        logger.info("started %s %d (pid %d)", self.what, rank, process.pid)
        with self._lock:
            self._workers.append(_Worker(rank, process, here))
        return here

    @property
    def pids(self) -> dict[int, int]:
        """rank -> pid of every worker not yet stopped."""
        return {worker.rank: worker.process.pid for worker in self._workers}

    def failure(self, wait: float = DEATH_WAIT) -> WorkerError | None:
        """A :class:`WorkerError` naming every worker that has exited (waiting up to
        ``wait`` seconds for one to), with what it reported; None if all still run.
        ``rank``/``pid``/``exitcode`` are those of the likeliest culprit: a worker killed
        by a signal, else the lowest rank."""
        deadline = time.monotonic() + wait
        while True:
            dead = [w for w in self._workers if w.process.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        if not dead:
            return None
        dead.sort(key=lambda w: (w.process.exitcode >= 0, w.rank))
        parts = [f"{self.what} {w.rank} (pid {w.process.pid}) "
                 f"{describe_exit(w.process.exitcode)}{_reported(w.conn)}" for w in dead]
        first = dead[0]
        return WorkerError("; ".join(parts), rank=first.rank, pid=first.process.pid,
                           exitcode=first.process.exitcode)

    def stop(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every worker to exit, terminate (then kill)
        the ones still running, and release them; idempotent."""
        with self._lock:
            workers, self._workers = self._workers, []
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
        for worker in workers:
            for end in (worker.process.terminate, worker.process.kill):
                if worker.process.exitcode is not None:
                    break
                logger.warning("%s %d (pid %d) did not exit: %s", self.what, worker.rank,
                               worker.process.pid, end.__name__)
                end()
                worker.process.join(2.0)
            worker.process.join()
            worker.process.close()
            worker.conn.close()


def _reported(conn: Connection) -> str:
    """``": <what the worker sent>"`` when it sent text before dying, else ``""``."""
    try:
        if conn.poll():
            message = conn.recv()
            return f": {message}" if isinstance(message, str) else ""
    except (EOFError, OSError):
        pass
    return ""
