"""``Proposer``: what speculative decoding's proposers implement, and what they may read.

Before each engine step the engine asks its proposer for up to ``limits[i]`` tokens to
follow each decoding sequence; the target model then scores them all in one step and the
``rejection_sample`` op keeps the longest prefix the target agrees with (plus one token of
its own). A proposal is deterministic (``Proposal.probs`` None: an n-gram match, a greedy
draft model) or comes with the probabilities its tokens were drawn from, which the
rejection sampler then uses to keep the target's distribution exact.

Room for EAGLE and MTP heads: such a proposer reads the target's hidden states at the
sequence's last accepted positions. They are not passed today; a head proposer would add
them to :class:`ProposerTarget` / ``propose``'s inputs (the runner has them after every
step) and give ``probs``, see docs/generation.md.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug import checks
from hwplug.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from hwplug.model_zoo.context import ModelContext
    from hwplug.model_zoo.engine.sequence import Sequence
    from hwplug.model_zoo.llm_config import LLMConfig
    from hwplug.model_zoo.speculative.config import SpeculativeConfig


@dataclass(frozen=True)
class ProposerTarget:
    """What a proposer may read of the engine it proposes for: the target's options
    (``options.model`` is its checkpoint), build context, vocabulary size, KV blocks per
    layer and longest sequence."""

    options: LLMConfig
    ctx: ModelContext
    vocab_size: int
    num_blocks: int
    max_model_len: int


@dataclass
class Proposal:
    """``token_ids[i]``: the tokens proposed to follow sequence ``i`` (possibly none);
    ``probs``: ``[sum of their counts, vocab]`` fp32, the distribution each was drawn
    from, or None for deterministic proposals."""

    token_ids: list[list[int]]
    probs: torch.Tensor | None = None


class Proposer(abc.ABC):
    """Proposes tokens for decoding sequences; one instance per engine."""

    #: The options ``speculative_config`` may give this proposer: name -> (default, check).
    options: ClassVar[Mapping[str, tuple[Any, checks.Check]]] = {}

    def __init__(self, config: SpeculativeConfig, target: ProposerTarget) -> None:
        self.config, self.target = config, target

    @classmethod
    def check_options(cls, name: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """This proposer's options from ``given`` (defaults for the rest), each checked;
        :class:`ConfigError` naming an unknown one and the valid ones."""
        unknown = sorted(set(given) - set(cls.options))
        if unknown:
            valid = ", ".join(["method", "num_speculative_tokens", "adaptive_length",
                               *cls.options])
            raise ConfigError(f"{name} has no option {', '.join(unknown)}; options: {valid}")
        return {key: check(f"{name}[{key!r}]", given.get(key, default))
                for key, (default, check) in cls.options.items()}

    @abc.abstractmethod
    def propose(self, seqs: Seq[Sequence], limits: Seq[int]) -> Proposal:
        """Up to ``limits[i]`` (>= 1) tokens to follow each of ``seqs`` (decoding
        sequences: all their tokens but the last are computed)."""

    def release(self, seq: Sequence) -> None:  # noqa: B027 - most proposers hold nothing
        """Forget ``seq`` (finished): free what the proposer holds for it."""

    def describe(self) -> str:
        """One line for logs and ``LLM.config``."""
        return self.config.describe()
