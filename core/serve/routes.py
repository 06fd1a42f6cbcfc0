"""The routes of ``hwplug serve``'s app: each reads and checks its body, then answers.

A body is read up to the server's ``max_request_bytes`` (413 beyond, before it is all
read when ``Content-Length`` says so) and parsed by :func:`~hwplug.serve.protocol.parse_body`.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from hwplug.serve.prepare import chat_prompt, prepare_chat, prepare_completion
from hwplug.serve.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    parse_body,
)

if TYPE_CHECKING:
    from hwplug.serve.app import Generation
    from hwplug.serve.state import ServerState

#: A body over the limit is read and dropped up to this many times the limit.
DRAIN_FACTOR = 16
#: Every route's path (the metrics count the others as ``other``).
PATHS = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions",
         "/v1/embeddings", "/tokenize", "/detokenize")


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; 413 when it holds more than ``limit`` bytes (the rest of a body
    up to :data:`DRAIN_FACTOR` times the limit is read and dropped first, so the client
    can read the answer before the connection closes)."""
    declared = request.headers.get("content-length", "")
    body = bytearray()
    try:
        async with aclosing(request.stream()) as chunks:
            if not (declared.isdigit() and int(declared) > limit):
                async for chunk in chunks:
                    body += chunk
                    if len(body) > limit:
                        break
                else:
                    return bytes(body)
            drained = len(body)
            async for chunk in chunks:
                drained += len(chunk)
                if drained > DRAIN_FACTOR * limit:
                    break
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected before sending the whole body") from None
    raise ApiError(413, f"the request body is larger than the server's limit of {limit} "
                        "bytes", code="request_too_large")


def add_routes(app: FastAPI, state: ServerState, generation: Generation) -> None:
    """The endpoints (but ``/metrics``) of ``state``'s model."""
    created = int(time.time())

    async def body_of(request: Request, model: type[Any]) -> Any:
        state.authorize(request.headers.get("authorization"))
        body = parse_body(await read_body(request, state.max_request_bytes), model)
        state.check_model(getattr(body, "model", None))
        return body

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.shutting_down:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        state.authorize(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": created,
            "owned_by": "hwplug", "max_model_len": state.llm.max_model_len}]})

    async def generate(request: Request, kind: str, model: type[Any],
                       prepare: Callable[[Any, Any], Any]) -> Any:
        body = await body_of(request, model)
        prepared = prepare(state.decoder().llm, body)
        return await generation.answer(request, kind, prepared, body.stream,
                                       _include_usage(body))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await generate(request, "completion", CompletionRequest, prepare_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await generate(request, "chat", ChatCompletionRequest, prepare_chat)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await body_of(request, EmbeddingRequest)
        llm = state.llm
        if not llm.is_encoder:
            raise ApiError(400, f"the model {state.model_name!r} is a decoder: it serves no "
                                "embeddings (serve an encoder, e.g. all-minilm-l6-v2)",
                           param="model")
        texts = body.texts()
        counts = [len(llm.tokenizer(text).input_ids) for text in texts]
        for index, count in enumerate(counts):
            if count > llm.max_model_len:
                raise ApiError(413, f"input[{index}] has {count} tokens but the model's "
                                    f"context holds {llm.max_model_len}", param="input",
                               code="context_length_exceeded")
        release = state.admit(1)  # one batch on the engine's thread
        try:
            vectors = await asyncio.to_thread(llm.embed, texts)
        finally:
            release()
        return JSONResponse({"object": "list", "model": state.model_name, "data": [
            {"object": "embedding", "index": i, "embedding": _encode(vector, body)}
            for i, vector in enumerate(vectors)],
            "usage": {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}})

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await body_of(request, TokenizeRequest)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "give a prompt or messages (one of them)", param="prompt")
        llm = state.llm
        if body.messages is not None:
            tokens = chat_prompt(llm, body.messages)
        else:
            tokens = list(llm.tokenizer(body.prompt,
                                        add_special_tokens=body.add_special_tokens).input_ids)
        return JSONResponse({"tokens": tokens, "count": len(tokens),
                             "max_model_len": llm.max_model_len})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await body_of(request, DetokenizeRequest)
        vocab = int(state.llm.hf_config.vocab_size)
        bad = [token for token in body.tokens if token >= vocab]
        if bad:
            raise ApiError(400, f"tokens must be in [0, {vocab}), got {bad[:5]}",
                           param="tokens")
        return JSONResponse({"prompt": state.llm.tokenizer.decode(body.tokens)})


def _encode(vector: Any, body: EmbeddingRequest) -> list[float] | str:
    """An embedding as a list of floats, or base64 of its little-endian float32 bytes
    (the openai client's default)."""
    if body.encoding_format == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def _include_usage(body: CompletionRequest | ChatCompletionRequest) -> bool:
    """Whether a streamed answer ends with a usage chunk (``stream_options`` needs
    ``stream``)."""
    if body.stream_options is None:
        return False
    if not body.stream:
        raise ApiError(400, "stream_options needs stream: true", param="stream_options")
    return body.stream_options.include_usage
