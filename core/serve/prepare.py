"""From a checked request body to what the engine runs: token ids and ``SamplingParams``.

Limits that depend on the model are checked here, each an
:class:`~hwplug.serve.protocol.ApiError`: a prompt that leaves no room in the context is
413 (``context_length_exceeded``); a ``max_tokens`` beyond the room left, a token id
outside the vocabulary or a stop token id outside it are 400 naming the field and its
valid values. ``response_format`` (``json_object``, ``json_schema``) becomes the
request's structured-output constraint (an invalid schema is 400 too). OpenAI's defaults apply: 16 new
tokens for a completion, the rest of the context (as far as the KV cache holds it) for a
chat completion, and temperature 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwplug.errors import HwplugError
from hwplug.serve.protocol import ApiError, ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from hwplug import LLM, SamplingParams
    from hwplug.model_zoo.sampling import StructuredOutput

#: ``max_tokens`` of a completion that gives none (OpenAI's default).
DEFAULT_COMPLETION_TOKENS = 16


@dataclass
class Prepared:
    """One generation request: a token-id prompt per engine request, each prompt's text
    (for ``echo``), the sampling parameters they share, and the log-probabilities to
    report per token (None: none)."""

    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    sampling: SamplingParams
    logprobs: int | None
    echo: bool = False

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompt_ids)


def prepare_completion(llm: LLM, body: CompletionRequest) -> Prepared:
    """The engine inputs of ``POST /v1/completions``."""
    prompt_ids, texts = [], []
    for index, prompt in enumerate(body.prompts()):
        ids = llm.tokenize(prompt)
        field = "prompt" if len(body.prompts()) == 1 else f"prompt[{index}]"
        _check_ids(llm, ids, field)
        prompt_ids.append(ids)
        texts.append(prompt if isinstance(prompt, str) else llm.tokenizer.decode(ids))
    max_tokens = _max_tokens(llm, body.max_tokens, "max_tokens", prompt_ids,
                             DEFAULT_COMPLETION_TOKENS)
    prompt_logprobs = body.logprobs if body.echo and body.logprobs is not None else None
    sampling = _sampling(llm, body, max_tokens, body.logprobs, prompt_logprobs)
    return Prepared(prompt_ids, texts, sampling, body.logprobs, body.echo)


def prepare_chat(llm: LLM, body: ChatCompletionRequest) -> Prepared:
    """The engine inputs of ``POST /v1/chat/completions`` (the chat template applied)."""
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    ids = chat_prompt(llm, body.messages)
    _check_ids(llm, ids, "messages")
    if body.max_tokens is not None and body.max_completion_tokens is not None:
        raise ApiError(400, "give max_completion_tokens or max_tokens, not both",
                       param="max_completion_tokens")
    requested = body.max_completion_tokens or body.max_tokens
    name = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    max_tokens = _max_tokens(llm, requested, name, [ids], None)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = _sampling(llm, body, max_tokens, logprobs, None, _structured(body))
    return Prepared([ids], [""], sampling, logprobs)


def _structured(body: ChatCompletionRequest) -> StructuredOutput | None:
    """The constraint ``response_format`` asks for (None: plain text)."""
    from hwplug.model_zoo.sampling import StructuredOutput

    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutput(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise ApiError(400, "response_format of type json_schema needs json_schema.schema, "
                            "a JSON schema", param="response_format.json_schema")
    return StructuredOutput(json_schema=json.dumps(fmt.json_schema.schema_))


def chat_prompt(llm: LLM, messages: list[Any]) -> list[int]:
    """The token ids of ``messages`` formatted by the model's chat template."""
    try:
        return llm.apply_chat_template([{"role": m.role, "content": m.text()}
                                        for m in messages])
    except HwplugError as exc:  # no chat template
        raise ApiError(400, str(exc), param="messages") from None


def _check_ids(llm: LLM, ids: list[int], field: str) -> None:
    vocab = llm.engine.vocab_size
    bad = [token for token in ids if token >= vocab]
    if bad:
        raise ApiError(400, f"{field}: token ids must be in [0, {vocab}), got {bad[:5]}",
                       param=field)
    if len(ids) >= llm.max_model_len:
        raise ApiError(413, f"{field}: the prompt has {len(ids)} tokens but the model's "
                            f"context holds {llm.max_model_len}, and at least one must be "
                            "left to generate", param=field, code="context_length_exceeded")


def _max_tokens(llm: LLM, requested: int | None, name: str, prompt_ids: list[list[int]],
                default: int | None) -> int:
    """``requested``, checked against the room the longest prompt leaves; else
    ``default`` (None: all the room the context and the KV cache leave)."""
    longest = max(len(ids) for ids in prompt_ids)
    room = llm.max_model_len - longest
    if requested is not None and requested > room:
        raise ApiError(400, f"{name}: the prompt has {longest} tokens and the context holds "
                            f"{llm.max_model_len}: {name} must be in [1, {room}], got "
                            f"{requested}", param=name, code="context_length_exceeded")
    if requested is not None:
        return requested
    blocks = llm.block_manager
    cache_room = blocks.num_blocks * blocks.block_size - longest
    return max(1, min(room, cache_room, default or room))


def _sampling(llm: LLM, body: Any, max_tokens: int, logprobs: int | None,
              prompt_logprobs: int | None,
              structured: StructuredOutput | None = None) -> SamplingParams:
    from hwplug import SamplingParams

    vocab = llm.engine.vocab_size
    bad = [token for token in body.stop_token_ids or () if token >= vocab]
    if bad:
        raise ApiError(400, f"stop_token_ids must be in [0, {vocab}), got {bad[:5]}",
                       param="stop_token_ids")
    return SamplingParams(
        max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=max(body.top_k, 0), repetition_penalty=body.repetition_penalty,
        frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
        seed=body.seed,
        stop=body.stop_strings(), stop_token_ids=body.stop_token_ids or (),
        ignore_eos=body.ignore_eos, n=body.n, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs, structured=structured)
