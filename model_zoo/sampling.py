"""``SamplingParams`` (what a request asks for) and :func:`sample` (picking the next tokens).

:func:`sample` takes one step's logits ``[N, vocab]`` float32, one :class:`SamplingParams`
per row, and returns the next token of every row as ``LongTensor[N]``. It is vectorised
over the batch: a greedy batch costs one ``argmax``; temperature, top-k and top-p are
applied to all sampled rows at once, with one sort only when a row asks for top-k/top-p.
Rows with their own ``seed`` draw from their own ``torch.Generator`` (so their tokens
do not depend on what else is in the batch); the others share the engine's generator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from numbers import Real
from typing import Any

import torch

from hwplug.checks import MAX_SEED, is_integer
from hwplug.errors import ConfigError
from hwplug.kernel_registry.reference.sampling import truncate

__all__ = ["MAX_SEED", "SamplingParams", "StructuredOutput"]


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the generated text, exactly one of: ``json_schema`` (a JSON schema,
    as JSON text), ``json_object`` (any JSON object), ``regex`` or ``grammar`` (a Lark
    grammar). The engine masks, before each sampling, every token that would leave the
    language (:mod:`~hwplug.model_zoo.engine.structured`, with llguidance), and ends the
    completion when the text is complete."""

    json_schema: str | None = None
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json_schema", "regex", "grammar")
                 if getattr(self, name) is not None] + (["json_object"] if self.json_object
                                                        else [])
        if len(given) != 1 or not all(isinstance(getattr(self, name), str)
                                      for name in given if name != "json_object"):
            raise ConfigError("a StructuredOutput holds exactly one of json_schema (JSON "
                              "text), json_object=True, regex or grammar (text), got "
                              f"{', '.join(given) or 'none'}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the tokens of one request and when to stop.

    ``temperature`` 0 is greedy (the default); otherwise tokens are sampled from
    ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
    (0 = all) and to the smallest set whose probability reaches ``top_p``.
    ``repetition_penalty`` > 1 makes tokens already in the prompt or output less likely
    (Hugging Face semantics: positive logits divided, negative ones multiplied).
    ``frequency_penalty`` and ``presence_penalty`` (in ``[-2, 2]``, 0 = off; OpenAI's
    semantics) subtract from each token's logit ``frequency_penalty`` times the number of
    times it is already in the output, plus ``presence_penalty`` if it is there at all
    (the prompt does not count).
    Generation stops after ``max_tokens`` tokens, at an end-of-sequence token (unless
    ``ignore_eos``), at one of ``stop_token_ids``, or when the text ends with one of the
    ``stop`` strings (which is trimmed from the output). ``seed`` (an integer in
    ``[0, 2**64 - n]``) makes a sampled request reproducible whatever else is in the batch.

    ``n`` completions are generated per prompt (sample ``i`` of a seeded request uses
    ``seed + i``, as vLLM does). ``logprobs=k`` returns, for every generated token, the
    log-probability of the sampled token and of the ``k`` most likely ones;
    ``prompt_logprobs=k`` the same for every prompt token after the first (vLLM's names and
    shapes, see :class:`~hwplug.model_zoo.engine.output.Output`). Log-probabilities are
    those of the model's raw distribution (``log_softmax`` of the logits, before the
    temperature, top-k/top-p and the penalty). ``cache_salt`` keeps the request's KV
    blocks apart from those of requests with another salt (or none): it is hashed into
    its first block, so prefix caching and connectors share blocks only between equal
    salts. ``structured`` (a :class:`StructuredOutput`) constrains the text to a JSON
    schema, a regex or a grammar. Invalid types or values raise
    :class:`~hwplug.errors.ConfigError` naming the valid range; ``k`` above the vocabulary
    size and stop token ids outside it are refused when the request is made.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    cache_salt: str | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        for name in ("stop", "stop_token_ids"):  # a list (or one stop string) -> a tuple
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, (value,))
            elif isinstance(value, Iterable) and not isinstance(value, bytes):
                object.__setattr__(self, name, tuple(value))
        problems = self._problems()
        if problems:
            raise ConfigError("invalid sampling parameters: " + "; ".join(problems))

    def _problems(self) -> list[str]:
        n_ok = is_integer(self.n) and self.n >= 1
        checks = (
            (is_integer(self.max_tokens) and self.max_tokens >= 1,
             f"max_tokens must be an integer >= 1, got {self.max_tokens!r}"),
            (_is_real(self.temperature) and self.temperature >= 0,
             f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}"),
            (is_integer(self.top_k) and self.top_k >= 0,
             f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}"),
            (_is_real(self.top_p) and 0 < self.top_p <= 1,
             f"top_p must be a number in (0, 1], got {self.top_p!r}"),
            (_is_real(self.repetition_penalty) and self.repetition_penalty > 0,
             f"repetition_penalty must be a finite number > 0 (1 = off), got "
             f"{self.repetition_penalty!r}"),
            (_is_real(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
             f"frequency_penalty must be a number in [-2, 2] (0 = off), got "
             f"{self.frequency_penalty!r}"),
            (_is_real(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             f"presence_penalty must be a number in [-2, 2] (0 = off), got "
             f"{self.presence_penalty!r}"),
            (n_ok, f"n must be an integer >= 1, got {self.n!r}"),
            (self.seed is None or (is_integer(self.seed) and 0 <= self.seed
                                   and self.seed + (self.n if n_ok else 1) - 1 <= MAX_SEED),
             f"seed must be None or an integer in [0, 2**64 - n], got {self.seed!r}"),
            (_is_strings(self.stop), f"stop must be a string or a list of non-empty strings, "
                                     f"got {self.stop!r}"),
            (_is_ints(self.stop_token_ids), f"stop_token_ids must be a list of integers >= 0, "
                                            f"got {self.stop_token_ids!r}"),
            (isinstance(self.ignore_eos, bool), f"ignore_eos must be True or False, got "
                                                f"{self.ignore_eos!r}"),
            (self.logprobs is None or (is_integer(self.logprobs) and self.logprobs >= 0),
             f"logprobs must be None or an integer >= 0, got {self.logprobs!r}"),
            (self.prompt_logprobs is None or (is_integer(self.prompt_logprobs)
                                              and self.prompt_logprobs >= 0),
             f"prompt_logprobs must be None or an integer >= 0, got {self.prompt_logprobs!r}"),
            (self.cache_salt is None or (isinstance(self.cache_salt, str) and self.cache_salt),
             f"cache_salt must be None or a non-empty string, got {self.cache_salt!r}"),
            (self.structured is None or isinstance(self.structured, StructuredOutput),
             f"structured must be None or a StructuredOutput, got {self.structured!r}"),
        )
        return [message for ok, message in checks if not ok]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p removes tokens before sampling."""
        return self.top_k > 0 or self.top_p < 1

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of completion ``index`` of ``n``: one completion, ``seed + index``;
        only completion 0 computes the prompt's log-probabilities."""
        seed = None if self.seed is None else self.seed + index
        return replace(self, n=1, seed=seed,
                       prompt_logprobs=self.prompt_logprobs if index == 0 else None)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_strings(value: Any) -> bool:
    return isinstance(value, tuple) and all(isinstance(item, str) and item for item in value)


def _is_ints(value: Any) -> bool:
    return isinstance(value, tuple) and all(is_integer(item) and item >= 0 for item in value)


@dataclass
class SamplingRow:
    """One row of a step's logits: its parameters, generator and token history."""

    params: SamplingParams
    generator: torch.Generator | None = None
    #: Prompt and output tokens so far; read only when the params have a penalty.
    token_ids: Sequence[int] = field(default_factory=list)
    #: How many of ``token_ids`` are the prompt's (the frequency and presence penalties
    #: count only the output's).
    num_prompt_tokens: int = 0


def sample(logits: torch.Tensor, rows: Sequence[SamplingRow],
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ``LongTensor[N]`` for each row of ``logits [N, vocab]`` (float32).

    ``generator`` serves the sampled rows that have none of their own. ``logits`` may be
    modified in place.
    """
    params = [row.params for row in rows]
    penalised = [i for i, p in enumerate(params) if p.repetition_penalty != 1]
    for i in penalised:
        _apply_repetition_penalty(logits[i], rows[i].token_ids, params[i].repetition_penalty)
    for i, p in enumerate(params):
        if p.frequency_penalty or p.presence_penalty:
            _apply_output_penalties(logits[i], rows[i].token_ids[rows[i].num_prompt_tokens:], p)
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(dim=-1)
    temperatures = torch.tensor([p.temperature or 1.0 for p in params],
                                dtype=logits.dtype, device=logits.device)
    logits.div_(temperatures[:, None])
    if any(p.truncates for p in params):
        logits = _truncate(logits, params)
    probs = logits.softmax(dim=-1)
    sampled = _draw(probs, rows, generator)
    if any(greedy):
        mask = torch.tensor(greedy, device=logits.device)
        sampled = torch.where(mask, logits.argmax(dim=-1), sampled)
    return sampled


def _apply_output_penalties(logits: torch.Tensor, output_ids: Sequence[int],
                            params: SamplingParams) -> None:
    """In place on one row ``[vocab]``: OpenAI's frequency and presence penalties over the
    tokens generated so far."""
    if not output_ids:
        return
    counts = torch.bincount(torch.tensor(output_ids, device=logits.device),
                            minlength=logits.shape[-1])[:logits.shape[-1]].to(logits.dtype)
    logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def _apply_repetition_penalty(logits: torch.Tensor, token_ids: Sequence[int],
                              penalty: float) -> None:
    """In place on one row ``[vocab]``: divide positive, multiply negative seen logits."""
    if not token_ids:
        return
    ids = torch.tensor(token_ids, device=logits.device)
    seen = logits[ids]
    logits[ids] = torch.where(seen > 0, seen / penalty, seen * penalty)


def _truncate(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """``logits`` with tokens outside each row's top-k / top-p set at ``-inf``."""
    top_k = torch.tensor([p.top_k or 0 for p in params], device=logits.device)
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=logits.device)
    return truncate(logits, top_k, top_p)


def _draw(probs: torch.Tensor, rows: Sequence[SamplingRow],
          generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs [N, vocab]`` by the exponential race
    (``argmax(p / E)``, ``E ~ Exp(1)``), each row's noise from its own generator if it has
    one."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for i, row in enumerate(rows):
        if row.generator is not None:
            noise[i].exponential_(generator=row.generator)
    return (probs / noise).argmax(dim=-1)
