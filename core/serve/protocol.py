"""The OpenAI-compatible request bodies ``hwplug serve`` accepts, checked field by field.

Every body is a JSON object validated by a strict pydantic model: an unknown field, a
wrong type (a string for a number, a float for an integer, ``true`` for a count) or a
value out of range is an :class:`ApiError` (status 400) whose message names the field and
its valid values, in OpenAI's error shape (:meth:`ApiError.body`). :func:`parse_body` also
refuses bodies that are not UTF-8, not JSON, hold NaN or Infinity, or hold text a
tokenizer cannot take (lone UTF-16 surrogates). Limits that depend on the model (the
context length, the vocabulary) are checked later, by the endpoints.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hwplug.checks import MAX_SEED

#: Most completions per prompt (``n``), stop strings and log-probabilities per token.
MAX_N = 128
MAX_STOP = 16
MAX_LOGPROBS = 20


class ApiError(Exception):
    """An error answered in OpenAI's shape with HTTP ``status``; ``param`` names the
    request field at fault."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type, self.code, self.headers = type, code, headers or {}

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


TokenId = Annotated[int, Field(ge=0)]


class StreamOptions(_Body):
    include_usage: bool = False


class _Generation(_Body):
    """The fields completions and chat completions share."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    repetition_penalty: float = Field(1.0, gt=0, le=10)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = Field(None, ge=0, le=MAX_SEED - MAX_N)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> Any:
        items = [value] if isinstance(value, str) else value
        if value is not None and not (
                isinstance(items, list) and len(items) <= MAX_STOP
                and all(isinstance(item, str) and item for item in items)):
            raise ValueError(f"must be a non-empty string or a list of at most {MAX_STOP} "
                             "non-empty strings")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(_Generation):
    """``POST /v1/completions``."""

    prompt: Any
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> Any:
        if not _is_prompt(value) and not (
                isinstance(value, list) and value and all(_is_prompt(p) for p in value)):
            raise ValueError("must be a non-empty string, a list of token ids, or a "
                             "non-empty list of those")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompts, one per engine request."""
        return [self.prompt] if _is_prompt(self.prompt) else list(self.prompt)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> Any:
        if value is None or isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(part, dict) and part.get("type") == "text" for part in value)):
            return value
        raise ValueError('must be a string or a list of {"type": "text", "text": ...} parts '
                         "(text is the only kind of content served)")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class JsonSchemaFormat(_Body):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatCompletionRequest(_Generation):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None


class EmbeddingRequest(_Body):
    """``POST /v1/embeddings``."""

    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, value: Any) -> Any:
        if isinstance(value, str) or (isinstance(value, list) and value and all(
                isinstance(item, str) for item in value)):
            return value
        raise ValueError("must be a string or a non-empty list of strings")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class TokenizeRequest(_Body):
    """``POST /tokenize``: a ``prompt``, or chat ``messages`` formatted by the template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[TokenId]


def _is_prompt(value: Any) -> bool:
    """A non-empty string, or a non-empty list of token ids (integers, not booleans)."""
    if isinstance(value, str):
        return bool(value)
    return isinstance(value, list) and bool(value) and all(
        type(token) is int and token >= 0 for token in value)


def _reject_constant(name: str) -> Any:
    raise ApiError(400, f"the body holds {name}, which JSON numbers cannot be")


def parse_body(raw: bytes, model: type[BaseModel]) -> Any:
    """The request ``model`` of a raw body, or an :class:`ApiError` (400) naming what is
    wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at "
                            f"offset {exc.start}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(data).__name__}")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the body holds a lone UTF-16 surrogate (\\ud800-\\udfff), "
                            "which is no character") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _error(model, exc.errors()[0]) from None


def _error(model: type[BaseModel], error: Any) -> ApiError:
    """An :class:`ApiError` of pydantic's first error: the field, then what it must be."""
    loc = [part for part in error["loc"] if not _is_type_tag(part)]
    param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    param = param.lstrip(".") or None
    kind = error["type"]
    if kind == "extra_forbidden":
        return ApiError(400, f"unknown field {param!r}", param=param)
    if kind == "missing":
        return ApiError(400, f"the field {param!r} is required", param=param)
    message = error["msg"].removeprefix("Value error, ")
    valid = _valid_range(model, str(loc[0])) if len(loc) == 1 and kind in _BOUND_ERRORS else ""
    got = error.get("input")
    shown = "" if isinstance(got, dict | list) else f", got {json.dumps(got)[:80]}"
    return ApiError(400, f"{param}: {valid or message}{shown}", param=param)


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _is_type_tag(part: Any) -> bool:
    """pydantic's names of union members in an error's location (``str``, ``list[str]``)."""
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "none"}
                                      or "[" in part or part.startswith("function-"))


def _valid_range(model: type[BaseModel], name: str) -> str:
    """``must be in [lo, hi]`` (or a one-sided bound) from a field's constraints."""
    field = model.model_fields.get(name)
    if field is None:
        return ""
    low = high = None
    low_open = high_open = False
    for item in field.metadata:
        for attr, is_low, is_open in (("ge", True, False), ("gt", True, True),
                                      ("le", False, False), ("lt", False, True)):
            bound = getattr(item, attr, None)
            if bound is None:
                continue
            if is_low:
                low, low_open = bound, is_open
            else:
                high, high_open = bound, is_open
    if low is not None and high is not None:
        return f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f"must be {'>' if low_open else '>='} {low}"
    if high is not None:
        return f"must be {'<' if high_open else '<='} {high}"
    return ""
