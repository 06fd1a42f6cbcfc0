"""The engine side of speculative decoding: proposals before a step, verification in it.

:class:`Speculator` asks the proposer for up to ``k`` tokens (fewer where they would not
pay for their verify rows, :mod:`~hwplug.model_zoo.engine.proposal_length`, except for a
seeded request: how many random numbers its verification draws depends on the length,
which depends on timings, so it keeps ``k`` to stay reproducible) to follow each decoding
sequence that can take them (one whose sampling the verification reproduces: no
repetition/frequency/presence penalty, no log-probabilities, no structured output; and
with room left under ``max_tokens`` and ``max_model_len``) and puts them in its
``spec_token_ids``. The scheduler gives the sequence ``k + 1`` tokens in the next step,
the runner scores them all and :func:`verify` keeps what the ``rejection_sample`` op
accepts; the scheduler then appends those tokens and gives back the rejected ones' KV
blocks. The speculator counts proposals and acceptances for the run statistics, and
times the steps it learns the rows' cost from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Sequence as Seq
from itertools import accumulate

import torch

from hwplug import registries
from hwplug.model_zoo.engine.proposal_length import ProposalLength
from hwplug.model_zoo.engine.scheduler import ScheduledBatch
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.model_zoo.speculative.config import SpeculativeConfig
from hwplug.model_zoo.speculative.proposer import Proposer, ProposerTarget

logger = logging.getLogger(__name__)


def verify(logits: torch.Tensor, seqs: Seq[Sequence], generator: torch.Generator | None,
           sample: Callable[[torch.Tensor, list[Sequence]], list[int]],
           rejection_sample: Callable[..., torch.Tensor]) -> list[int | list[int]]:
    """The tokens of each of ``seqs`` from ``logits`` (a sequence's ``k + 1`` rows when it
    has ``k`` proposals, else one): ``sample(rows, seqs)`` for those without proposals,
    ``rejection_sample`` (the op, bound from the model's plan) for the others (a list:
    accepted proposals, then one token)."""
    counts = [len(seq.spec_token_ids) for seq in seqs]
    ends = list(accumulate(c + 1 for c in counts))
    out: list[int | list[int]] = [0] * len(seqs)
    plain = [i for i, count in enumerate(counts) if not count]
    if plain:
        rows = torch.tensor([ends[i] - 1 for i in plain], device=logits.device)
        for i, token in zip(plain, sample(logits[rows], [seqs[i] for i in plain]), strict=True):
            out[i] = token
    spec = [i for i, count in enumerate(counts) if count]
    rows = torch.tensor([r for i in spec for r in range(ends[i] - counts[i] - 1, ends[i])],
                        device=logits.device)
    params = [seqs[i].sampling for i in spec]
    kept = rejection_sample(
        logits[rows].float(),
        torch.tensor([t for i in spec for t in seqs[i].spec_token_ids], device=logits.device),
        [counts[i] for i in spec], None,
        torch.tensor([p.temperature for p in params], dtype=torch.float32,
                     device=logits.device),
        torch.tensor([p.top_k for p in params], dtype=torch.int64, device=logits.device),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=logits.device),
        [seqs[i].generator or (None if p.greedy else generator)
         for i, p in zip(spec, params, strict=True)]).tolist()
    for i, row in zip(spec, kept, strict=True):
        out[i] = [t for t in row if t >= 0]
    return out


def can_speculate(seq: Sequence) -> bool:
    """Whether verification reproduces ``seq``'s sampling (no penalties, log-probabilities
    or structured output)."""
    params = seq.sampling
    return (params.repetition_penalty == 1 and not params.frequency_penalty
            and not params.presence_penalty and params.logprobs is None and seq.guide is None)


class Speculator:
    """``proposer`` proposing up to ``k`` tokens per decoding sequence (``adaptive``: as
    many as pay, see :class:`ProposalLength`), and the counts."""

    def __init__(self, proposer: Proposer, k: int, adaptive: bool = True) -> None:
        self.proposer, self.k = proposer, k
        self.lengths = ProposalLength() if adaptive else None
        self._held: dict[int, Sequence] = {}
        #: Tokens proposed and verified, of them accepted, and verifications (a sequence's
        #: verify step) so far.
        self.num_proposed = self.num_accepted = self.num_verified = 0

    def propose(self, running: Seq[Sequence], max_model_len: int) -> None:
        """Set ``spec_token_ids`` of the ``running`` sequences that can take proposals."""
        for seq_id, seq in list(self._held.items()):
            if seq.is_finished:
                self.proposer.release(seq)
                del self._held[seq_id]
        if self.lengths is not None:
            self.lengths.keep_only({seq.seq_id for seq in running})
        seqs, limits = [], []
        for seq in running:
            limit = min(self.k, seq.sampling.max_tokens - seq.num_output_tokens - 1,
                        max_model_len - seq.num_tokens - 1)
            if seq.num_uncomputed_tokens != 1 or limit <= 0 or not can_speculate(seq):
                continue
            if self.lengths is not None and seq.generator is None:  # a seed: fixed length
                limit = self.lengths.length(seq.seq_id, limit, len(running))
            if limit > 0:
                seqs.append(seq)
                limits.append(limit)
        if not seqs:
            return
        proposal = self.proposer.propose(seqs, limits)
        for seq, tokens, limit in zip(seqs, proposal.token_ids, limits, strict=True):
            seq.spec_token_ids = list(tokens[:limit])
            self._held[seq.seq_id] = seq

    def record(self, batch: ScheduledBatch, tokens: Seq[int | Seq[int]],
               seconds: float | None) -> None:
        """Count a step's verifications (before the scheduler clears the proposals), and
        time it where it is a pure decode or verify step (no prompt tokens) that took
        ``seconds`` (None: not to be timed, e.g. a step that recorded a step graph)."""
        for seq, kept in zip(batch.sampled_seqs, tokens, strict=True):
            if seq.spec_token_ids:
                self.num_proposed += len(seq.spec_token_ids)
                self.num_accepted += len(kept) - 1
                self.num_verified += 1
                if self.lengths is not None:
                    self.lengths.observe_verification(seq.seq_id, len(seq.spec_token_ids),
                                                      len(kept) - 1)
        if self.lengths is not None and seconds is not None and batch.is_decode:
            self.lengths.observe_step(batch.num_tokens, seconds)

    def describe(self) -> str:
        return self.proposer.describe()


def build_speculator(speculative_config: dict | None, target: ProposerTarget
                     ) -> Speculator | None:
    """The speculator ``speculative_config`` (an ``LLM`` option) asks for, or None."""
    if speculative_config is None:
        return None
    config = SpeculativeConfig.create("speculative_config", speculative_config)
    proposer = registries.proposers.get(config.method)(config, target)
    logger.info("speculative decoding: %s", proposer.describe())
    return Speculator(proposer, config.num_speculative_tokens, config.adaptive_length)
