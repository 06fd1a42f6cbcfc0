"""What one ``hwplug serve`` app holds: the model, its asynchronous front, the limits,
the metrics, and the admission of requests.

Admission bounds the work in flight: the engine runs ``max_num_seqs`` requests at once
and up to ``max_queued_requests`` more may wait; a request beyond that, or any request
once the server is shutting down, is answered 503 with ``Retry-After``. Each admitted
request holds its place (one per prompt) until its answer is complete or abandoned.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from hwplug.serve.metrics import Metrics
from hwplug.serve.protocol import ApiError

if TYPE_CHECKING:
    from hwplug import LLM
    from hwplug.model_zoo.async_llm import AsyncLLM
    from hwplug.model_zoo.engine.llm_engine import EngineStats

logger = logging.getLogger(__name__)

#: Seconds a client refused for capacity is told to wait (``Retry-After``).
RETRY_AFTER_SECONDS = 1


class ServerState:
    """The app's state (``app.state.hwplug``); used from the event loop's thread only."""

    def __init__(self, llm: LLM, engine: AsyncLLM | None, *, model_name: str,
                 api_key: str | None, max_queued_requests: int,
                 max_request_bytes: int) -> None:
        self.llm, self.engine, self.model_name = llm, engine, model_name
        self.api_key = api_key
        self.max_queued_requests = max_queued_requests
        self.max_request_bytes = max_request_bytes
        #: Requests (prompts) admitted and not yet answered.
        self.in_flight = 0
        #: Set when the server begins to shut down: new requests are refused.
        self.shutting_down = False
        self.metrics = Metrics(self._stats, self._admitted)

    @property
    def capacity(self) -> int:
        """Prompts that may be in flight at once."""
        return self.llm.max_num_seqs + self.max_queued_requests

    def _stats(self) -> EngineStats:
        return self.llm.engine.stats()

    def _admitted(self) -> tuple[int, int]:
        return self.in_flight, max(0, self.in_flight - self.llm.max_num_seqs)

    def authorize(self, authorization: str | None) -> None:
        """Raise a 401 :class:`ApiError` unless the ``Authorization`` header holds the
        API key as a bearer token (no key configured: everyone is allowed)."""
        if self.api_key is None:
            return
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer "
                                "<key>'", type="authentication_error", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    def check_model(self, model: str | None) -> None:
        """Raise 404 unless ``model`` is None or the served model's name."""
        if model is not None and model != self.model_name:
            raise ApiError(404, f"the model {model!r} does not exist: this server serves "
                                f"{self.model_name!r}", param="model", code="model_not_found")

    def decoder(self) -> AsyncLLM:
        """The asynchronous front of a decoder model; 400 for an encoder."""
        if self.engine is None:
            raise ApiError(400, f"the model {self.model_name!r} is an encoder: it serves "
                                "/v1/embeddings only", param="model")
        return self.engine

    def admit(self, count: int) -> Callable[[], None]:
        """Take ``count`` places for a request's prompts; returns the function that gives
        them back (idempotent). 503 when the server is full or shutting down."""
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", type="server_error",
                           code="shutting_down")
        if count > self.capacity:
            raise ApiError(400, f"the request holds {count} prompts but the server admits "
                                f"{self.capacity} at once", param="prompt")
        if self.in_flight + count > self.capacity:
            raise ApiError(503, f"the server is at capacity ({self.in_flight} requests in "
                                f"flight; max_num_seqs + max_queued_requests = "
                                f"{self.capacity}): retry later", type="server_error",
                           code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        self.in_flight += count
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.in_flight -= count

        return release
