"""Running the app under uvicorn, with a graceful shutdown.

On SIGTERM (or SIGINT, or :attr:`Server.should_exit` set by a caller) the :class:`Server`
stops accepting connections and marks the app as shutting down (new requests on open
connections get 503, ``/health`` says so), lets the requests in flight finish for up to
``shutdown_timeout`` seconds, then cancels what is left, which aborts their engine
requests, and returns. Logging is left to the caller's configuration (hwplug's CLI sets
it from ``HWPLUG_LOG_LEVEL``).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from hwplug.errors import ConfigError
from hwplug.serve import DEFAULT_SHUTDOWN_TIMEOUT

__all__ = ["Server", "bind"]

logger = logging.getLogger(__name__)


class Server(uvicorn.Server):
    """uvicorn's server for one ``hwplug serve`` app (see :func:`~hwplug.serve.app.create_app`)."""

    def __init__(self, app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
        self.app_state = app.state.hwplug
        super().__init__(uvicorn.Config(app, host=host, port=port, log_config=None,
                                        timeout_graceful_shutdown=shutdown_timeout,
                                        lifespan="off"))

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set by uvicorn on SIGTERM/SIGINT (or by a caller): from then on the app
        refuses new requests while uvicorn finishes those in flight."""
        self._should_exit = value
        if value and not self.app_state.shutting_down:
            self.app_state.shutting_down = True
            logger.info("shutting down: finishing %d requests in flight",
                        self.app_state.in_flight)

    def serve_forever(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until told to stop (by a signal in the main thread, or
        :attr:`should_exit`), then shut down gracefully and return; a SIGTERM that
        stopped it is not raised again (uvicorn's default is to re-raise it)."""
        quiet: dict[int, Any] = {}
        if _in_main_thread():
            quiet[signal.SIGTERM] = signal.signal(signal.SIGTERM, _ignore)
        try:
            self.run(sockets=sockets)
        finally:
            for sig, handler in quiet.items():
                signal.signal(sig, handler)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: a free port) for
    :meth:`Server.serve_forever`; :class:`~hwplug.errors.ConfigError` naming the address
    when it cannot be bound (in use, no such host)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _ignore(sig: int, frame: FrameType | None) -> None:
    """The SIGTERM handler uvicorn restores and calls once it has shut down."""


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
