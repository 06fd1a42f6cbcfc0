"""What a spawned worker process of a parallel ``LLM`` runs: it builds an ``LLM`` of its own.

The engine's parallel machinery (:mod:`hwplug.model_zoo.engine.parallel`) sits below
:class:`~hwplug.model_zoo.llm.LLM` and starts these programs by name
(:meth:`~hwplug.model_zoo.engine.parallel.processes.WorkerProcesses.spawn`).
"""

from __future__ import annotations

import logging
import os
import threading
from multiprocessing.connection import Connection
from typing import Any

from hwplug.model_zoo.engine.parallel.binding import bind_thread
from hwplug.model_zoo.engine.parallel.processes import ignore_interrupts
from hwplug.model_zoo.llm import LLM

logger = logging.getLogger(__name__)


def serve_replica(conn: Connection, options: dict[str, Any], cpus: tuple[int, ...] | None
                  ) -> None:
    """A replica's process: bind (before any thread starts, so its engine thread inherits
    the CPUs), build the ``LLM``, then run each call the driver sends on a thread of its
    own until the driver says stop or goes away."""
    ignore_interrupts()
    lock = threading.Lock()

    def reply(call_id: int | None, ok: bool, value: Any) -> None:
        with lock:
            conn.send((call_id, ok, value))

    try:
        bind_thread(cpus)
        llm = LLM(**options)
    except BaseException as exc:
        logger.error("data-parallel replica failed to start", exc_info=True)
        reply(None, False, f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
    reply(None, True, os.getpid())

    def handle(call_id: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            reply(call_id, True, getattr(llm, method)(*args))
        except Exception as exc:
            reply(call_id, False, f"{type(exc).__name__}: {exc}")

    try:
        while (message := conn.recv()) is not None:
            threading.Thread(target=handle, args=message, daemon=True).start()
    except EOFError:  # the driver is gone
        pass
    finally:
        llm.close()


def run_rank(conn: Connection, env: dict[str, str], options: dict[str, Any]) -> None:
    """A spawned rank's process: join as a torchrun rank would (``env``) and serve the
    driver from an ``LLM`` built with its ``options``; a failure is reported on ``conn``
    and ends the process with code 1."""
    ignore_interrupts()
    os.environ.update(env)
    try:
        LLM(**options).close()
    except BaseException as exc:
        logger.error("tensor-parallel rank %s failed", env["RANK"], exc_info=True)
        conn.send(f"{type(exc).__name__}: {exc}")
        raise SystemExit(1) from None
