"""The OpenAI-compatible HTTP app of ``hwplug serve`` (FastAPI), over one :class:`~hwplug.LLM`.

Endpoints: ``POST /v1/completions`` and ``/v1/chat/completions`` (streamed as server-sent
events when ``stream`` is true), ``/v1/embeddings`` (encoder models), ``GET /v1/models``,
``POST /tokenize`` and ``/detokenize``, ``GET /health`` and ``GET /metrics`` (Prometheus).
Generation runs on the model's engine thread through
:class:`~hwplug.model_zoo.async_llm.AsyncLLM`: every connection's requests join the
running batch. A client that disconnects, mid-stream or while waiting for a whole answer,
aborts its request, whose KV blocks are freed at once.

Every error is answered in OpenAI's shape (``{"error": {"message", "type", "param",
"code"}}``) with its status: 400 bad parameters (naming the field and its valid values),
401 a missing or wrong API key (when one is set; ``/health`` and ``/metrics`` are open),
404 an unknown model or route, 413 a body over ``max_request_bytes`` or a prompt beyond
the context, 503 a full queue (with ``Retry-After``) or a server shutting down, and 500,
without a traceback (it goes to the log), for anything unexpected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException
from starlette.types import Message, Receive, Scope, Send

from hwplug.errors import ConfigError, EngineStoppedError, HwplugError, ModelError
from hwplug.serve import DEFAULT_MAX_QUEUED_REQUESTS, DEFAULT_MAX_REQUEST_BYTES, routes
from hwplug.serve.prepare import Prepared
from hwplug.serve.protocol import ApiError
from hwplug.serve.responses import Formatter
from hwplug.serve.state import ServerState

if TYPE_CHECKING:
    from hwplug import LLM
    from hwplug.model_zoo.async_llm import AsyncRequest
    from hwplug.model_zoo.engine.llm_engine import RequestUpdate

__all__ = ["Generation", "create_app"]

logger = logging.getLogger(__name__)


def create_app(llm: LLM, *, model_name: str, api_key: str | None = None,
               max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS,
               max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """The app serving ``llm`` as ``model_name``. The app does not own ``llm``: close it
    after the server stops. ``max_queued_requests`` prompts may wait beyond the
    ``max_num_seqs`` the engine runs at once; ``api_key`` (None: no authentication) is
    required as a bearer token on every endpoint but ``/health`` and ``/metrics``."""
    from hwplug.model_zoo.async_llm import AsyncLLM

    engine = None if llm.is_encoder else AsyncLLM(llm)
    state = ServerState(llm, engine, model_name=model_name, api_key=api_key,
                        max_queued_requests=max_queued_requests,
                        max_request_bytes=max_request_bytes)
    app = FastAPI(title="hwplug", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.hwplug = state
    app.add_middleware(_CountRequests, state=state)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HwplugError, _hwplug_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    routes.add_routes(app, state, Generation(state))
    app.add_api_route("/metrics", lambda: Response(state.metrics.render(),
                                                   media_type=CONTENT_TYPE_LATEST),
                      methods=["GET"])
    return app


class Generation:
    """Runs prepared generation requests and answers them, whole or streamed."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def answer(self, request: Request, kind: str, prepared: Prepared, stream: bool,
                     include_usage: bool) -> Response:
        state = self.state
        release = state.admit(len(prepared.prompt_ids))
        try:
            running = state.decoder().submit(prepared.prompt_ids, prepared.sampling,
                                             prepared.prompt_texts)
        except BaseException:
            release()
            raise
        state.metrics.prompt_tokens.inc(prepared.num_prompt_tokens)
        formatter = Formatter(kind, state.model_name, prepared,
                              lambda token: state.llm.tokenizer.decode([token]))

        def close() -> None:
            running.abort()
            release()

        if stream:
            return _EventStream(self._events(running, formatter, include_usage), close)
        try:
            outputs = await _unless_disconnected(request, self._run(running))
        finally:
            close()
        if outputs is None:  # nobody is left to answer
            return Response(status_code=499)
        return JSONResponse(formatter.response(outputs))

    async def _updates(self, running: AsyncRequest) -> AsyncIterator[tuple[int, RequestUpdate]]:
        """The request's updates, timed into the metrics."""
        metrics = self.state.metrics
        last: dict[int, float] = {}
        async with aclosing(running.updates()) as updates:
            async for index, update in updates:
                tokens = sum(len(sample.token_ids) for sample in update.samples)
                if tokens:
                    now = time.monotonic()
                    if index in last:
                        metrics.inter_token_latency.observe(now - last[index])
                    else:
                        metrics.time_to_first_token.observe(now - running.arrival)
                    last[index] = now
                    metrics.generation_tokens.inc(tokens)
                yield index, update

    async def _run(self, running: AsyncRequest) -> list[Any]:
        async with aclosing(self._updates(running)) as updates:
            async for _ in updates:
                pass
        return list(running.outputs)

    async def _events(self, running: AsyncRequest, formatter: Formatter,
                      include_usage: bool) -> AsyncIterator[str]:
        """The server-sent events of a streamed answer; an error after the stream began
        is its last event."""
        try:
            async with aclosing(self._updates(running)) as updates:
                async for index, update in updates:
                    for chunk in formatter.chunks(index, update):
                        yield _event(chunk)
            if include_usage:
                yield _event(formatter.usage_chunk())
        except HwplugError as exc:
            logger.info("request %s failed while streaming: %s", formatter.id, exc)
            yield _event(ApiError(500, str(exc), type="server_error").body())
        yield "data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


class _EventStream(StreamingResponse):
    """A ``text/event-stream`` response that runs ``close`` however it ends (finished,
    client gone, server cancelled), even if the body never began."""

    def __init__(self, events: AsyncIterator[str], close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._events, self._close = events, close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._close()
            await self._events.aclose()


async def _unless_disconnected(request: Request, work: Any) -> Any:
    """``work``'s result, or None (``work`` cancelled) once the client disconnects."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        logger.info("client disconnected before its answer was ready")
        return None
    finally:
        task.cancel()
        watcher.cancel()


class _CountRequests:
    """ASGI middleware counting each answered request by route and status."""

    def __init__(self, app: Any, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope["path"] if scope["path"] in routes.PATHS else "other"
            self.state.metrics.requests.labels(path, str(status)).inc()


def _json_error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    return _json_error(exc)


async def _hwplug_error(request: Request, exc: Exception) -> JSONResponse:
    """A typed hwplug error: bad input (400), the engine stopped (503), else 500."""
    if isinstance(exc, ConfigError | ModelError):
        return _json_error(ApiError(400, str(exc)))
    if isinstance(exc, EngineStoppedError):
        return _json_error(ApiError(503, str(exc), type="server_error", code="shutting_down"))
    logger.error("%s answering %s %s: %s", type(exc).__name__, request.method,
                 request.url.path, exc)
    return _json_error(ApiError(500, f"{type(exc).__name__}: {exc}", type="server_error"))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    what = "no such route" if exc.status_code == 404 else exc.detail
    return _json_error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {what}",
                                code=None, headers=dict(exc.headers or {})))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("internal error answering %s %s", request.method, request.url.path,
                 exc_info=exc)
    return _json_error(ApiError(500, f"internal error ({type(exc).__name__}); the server's "
                                     "log holds the details", type="server_error"))
