"""``Sequence``: one request's tokens and how far the engine has computed them.

A sequence holds its prompt and output token ids, how many of them have their K/V in
the cache (``num_computed_tokens``), the cache blocks that hold them (``block_table``,
owned by the :class:`~hwplug.model_zoo.engine.block_manager.BlockManager`) and its
status. Preemption frees its blocks and resets ``num_computed_tokens`` to 0: the prompt
and the output so far are then recomputed as one longer prompt.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from hwplug.model_zoo.sampling import SamplingParams


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

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        self.num_prompt_tokens = len(self.token_ids)

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
