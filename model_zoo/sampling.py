"""``SamplingParams`` (what a request asks for) and :func:`sample` (picking the next tokens).

:func:`sample` takes one step's logits ``[N, vocab]`` float32, one :class:`SamplingParams`
per row, and returns the next token of every row as ``LongTensor[N]``. It is vectorised
over the batch: a greedy batch costs one ``argmax``; temperature, top-k and top-p are
applied to all sampled rows at once, with one sort only when a row asks for top-k/top-p.
Rows with their own ``seed`` draw from their own ``torch.Generator`` (so their tokens
do not depend on what else is in the batch); the others share the engine's generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hwplug.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the tokens of one request and when to stop.

    ``temperature`` 0 is greedy (the default); otherwise tokens are sampled from
    ``softmax(logits / temperature)`` restricted to the ``top_k`` most likely tokens
    (0 = all) and to the smallest set whose probability reaches ``top_p``.
    ``repetition_penalty`` > 1 makes tokens already in the prompt or output less likely
    (Hugging Face semantics: positive logits divided, negative ones multiplied).
    Generation stops after ``max_tokens`` tokens, at an end-of-sequence token (unless
    ``ignore_eos``), at one of ``stop_token_ids``, or when the text ends with one of the
    ``stop`` strings (which is trimmed from the output). ``seed`` makes a sampled request
    reproducible whatever else is in the batch. Invalid values raise
    :class:`~hwplug.errors.ConfigError` naming the valid range.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        checks = (
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (self.temperature >= 0, f"temperature must be >= 0 (0 = greedy), got "
                                    f"{self.temperature}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0 = no limit), got {self.top_k}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.repetition_penalty > 0, f"repetition_penalty must be > 0 (1 = off), got "
                                          f"{self.repetition_penalty}"),
            (all(self.stop), "stop strings must be non-empty"),
        )
        problems = [message for ok, message in checks if not ok]
        if problems:
            raise ConfigError("invalid sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p removes tokens before sampling."""
        return self.top_k > 0 or self.top_p < 1


@dataclass
class SamplingRow:
    """One row of a step's logits: its parameters, generator and token history."""

    params: SamplingParams
    generator: torch.Generator | None = None
    #: Prompt and output tokens so far; read only when ``params.repetition_penalty != 1``.
    token_ids: Sequence[int] = field(default_factory=list)


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
    greedy = [p.greedy for p in params]
    if all(greedy):
        return logits.argmax(dim=-1)
    temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
    logits.div_(temperatures[:, None])
    if any(p.truncates for p in params):
        logits = _truncate(logits, params)
    probs = logits.softmax(dim=-1)
    sampled = _draw(probs, rows, generator)
    if any(greedy):
        mask = torch.tensor(greedy, device=logits.device)
        sampled = torch.where(mask, logits.argmax(dim=-1), sampled)
    return sampled


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
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k or vocab for p in params], device=logits.device)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    ordered, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    removed = rank[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(removed, float("-inf"))
    probs = ordered.softmax(dim=-1)
    # keep a token while the mass before it is below top_p (the first token always stays)
    removed |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    return logits.scatter(1, order, ordered.masked_fill(removed, float("-inf")))


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
