"""``Sequence``: one request's tokens and how far the engine has computed them.

A sequence holds its prompt and output token ids, how many of them have their K/V in
the cache (``num_computed_tokens``), the cache blocks that hold them (``block_table``,
owned by the :class:`~hwplug.model_zoo.engine.block_manager.BlockManager`) and its
status. Preemption frees its blocks and resets ``num_computed_tokens`` to 0: the prompt
and the output so far are then recomputed as one longer prompt. A request with ``n``
completions is ``n`` sequences sharing its ``request_id``, told apart by ``index``; the
log-probabilities it asked for are collected here as the steps produce them.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hwplug.model_zoo.engine.block_hash import root_hash
from hwplug.model_zoo.engine.logprobs import RowLogprobs
from hwplug.model_zoo.sampling import SamplingParams

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.structured import Guide

#: The root hash of a sequence made without a model identity (tests, tools).
ROOT_HASH = root_hash("")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    """Why a sequence stopped: ``stop`` (EOS, a stop token or string), ``length``
    (``max_tokens`` or the model's context length) or ``abort`` (dropped unfinished)."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"

    def __str__(self) -> str:
        return self.value


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """A request in the engine. ``token_ids`` = prompt followed by the output so far."""

    token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: The request's own generator (seeded requests), else None.
    generator: torch.Generator | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    num_prompt_tokens: int = field(init=False)
    #: Leading tokens whose K/V are in the cache.
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    #: The stop token id or stop string that finished it, if one did.
    stop_reason: int | str | None = None
    #: The request this sequence belongs to, and which of its ``n`` completions it is.
    request_id: str = ""
    index: int = 0
    #: Per output token (``sampling.logprobs`` set): its and the top-k tokens' logprobs.
    logprobs: list[RowLogprobs] | None = field(init=False)
    #: Per prompt token (``sampling.prompt_logprobs`` set; None for the first).
    prompt_logprobs: list[RowLogprobs | None] | None = field(init=False)
    #: The parent hash of the first block (the model's), and the chained hashes of the
    #: full blocks of ``token_ids`` named so far.
    root_hash: str = field(default=ROOT_HASH, repr=False)
    block_hashes: list[str] = field(default_factory=list, repr=False)
    #: Leading blocks already registered in the prefix cache (or found there).
    num_cached_blocks: int = 0
    #: Where the output is in its structured-output grammar (``sampling.structured``).
    guide: Guide | None = field(default=None, repr=False)
    #: Tokens a speculative proposer put after ``token_ids`` for the next step to verify
    #: (a decoding sequence only; not part of ``token_ids`` until accepted).
    spec_token_ids: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.logprobs = None if self.sampling.logprobs is None else []
        self.prompt_logprobs = None if self.sampling.prompt_logprobs is None else [None]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next token can be sampled."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
