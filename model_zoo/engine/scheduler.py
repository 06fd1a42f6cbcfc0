"""``Scheduler``: which sequences run in the next step, and how many tokens each.

Continuous batching with chunked prefill. Every step has a budget of
``max_num_batched_tokens`` tokens. Running sequences are served first, oldest first,
each with all its uncomputed tokens (1 for a decoding sequence, plus the tokens proposed
for it to verify under speculative decoding; the rest of its prompt for one still in
prefill) or what is left of the budget (proposals that do not fit are dropped), so a long prompt is split
across steps while the other sequences keep decoding in the same mixed batch. Then
waiting sequences join, first come first served, while the budget, ``max_num_seqs`` and
the free KV blocks allow. When a running sequence needs a block and none is free, the
newest running sequence is preempted: its blocks are freed and it goes back to the front
of the waiting queue, to be recomputed later (its output so far is kept).

After the step, :meth:`Scheduler.update` records the computed tokens, appends the
sampled ones (after a verify step: the accepted proposals and the token that follows
them; the blocks of the rejected ones are given back, and only accepted tokens enter the
prefix cache) and finishes sequences on EOS, a stop token, ``max_tokens`` or the model's
context length; :meth:`Scheduler.finish` finishes one for a reason found outside
(a stop string).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.block_manager import BlockManager
from hwplug.model_zoo.engine.sequence import FinishReason, Sequence, SequenceStatus

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.kv_transfer import KVTransfer

logger = logging.getLogger(__name__)


@dataclass
class ScheduledBatch:
    """One step: ``seqs[i]`` computes its next ``num_new_tokens[i]`` tokens.

    ``sampled[i]`` is True when those tokens reach the end of ``seqs[i]`` (its
    ``spec_token_ids`` included), so the step yields its next token, or tokens after a
    verify step (False while a prompt is still being prefilled in chunks).
    """

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)

    def add(self, seq: Sequence, num_new_tokens: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new_tokens)
        self.sampled.append(num_new_tokens == seq.num_uncomputed_tokens
                            + len(seq.spec_token_ids))

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_decode(self) -> bool:
        """A pure decode or verify step: every sequence samples after computing one new
        token and its proposals (no prompt tokens). Read it before the proposals are
        cleared."""
        return all(self.sampled) and all(
            n == 1 + len(seq.spec_token_ids)
            for seq, n in zip(self.seqs, self.num_new_tokens, strict=True))

    @property
    def sampled_seqs(self) -> list[Sequence]:
        return [seq for seq, sampled in zip(self.seqs, self.sampled, strict=True) if sampled]

    def __bool__(self) -> bool:
        return bool(self.seqs)


def check_limits(max_num_seqs: int, max_num_batched_tokens: int) -> None:
    """Raise :class:`~hwplug.errors.ConfigError` unless both limits are >= 1."""
    for name, value in (("max_num_seqs", max_num_seqs),
                        ("max_num_batched_tokens", max_num_batched_tokens)):
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


class Scheduler:
    """Waiting and running queues over one :class:`BlockManager`."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 eos_token_ids: Seq[int] = ()) -> None:
        check_limits(max_num_seqs, max_num_batched_tokens)
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        #: Prompt tokens of the sequences started so far, and how many of them were found
        #: in the prefix cache (a preempted sequence counts again when it restarts).
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        #: The connector's engine side, asked for the KV of sequences that start.
        self.kv_transfer: KVTransfer | None = None

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        """The next step's batch (empty when nothing can run)."""
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preemptions_before = self.num_preemptions
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num_new = min(seq.num_uncomputed_tokens + len(seq.spec_token_ids), budget)
            del seq.spec_token_ids[max(num_new - seq.num_uncomputed_tokens, 0):]
            if not self._allocate_or_preempt(seq, num_new):
                break  # seq itself was the newest and was preempted
            batch.add(seq, num_new)
            budget -= num_new
            index += 1
        # after a preemption, new sequences would take the blocks the preempted one needs
        while (self.num_preemptions == preemptions_before and self.waiting and budget > 0
               and len(self.running) < self.max_num_seqs):
            seq = self.waiting[0]
            prefix = self.block_manager.cached_prefix(seq)
            computed = len(prefix) * self.block_manager.block_size
            external = (self.kv_transfer.external_tokens(seq, computed)
                        if self.kv_transfer is not None else 0)
            num_new = min(seq.num_tokens - computed - external, budget)
            if not self.block_manager.allocate(seq, external + num_new, prefix):
                break
            seq.num_computed_tokens = computed + external
            self.num_prefix_queried_tokens += seq.num_tokens
            self.num_prefix_hit_tokens += computed
            if external:
                self.kv_transfer.add_load(seq, len(prefix))
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.add(seq, num_new)
            budget -= num_new
        return batch

    def _allocate_or_preempt(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Allocate ``seq``'s blocks, preempting the newest running sequences as needed.

        Returns False when ``seq`` itself had to be preempted.
        """
        while not self.block_manager.allocate(seq, num_new_tokens):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        logger.debug("preempting sequence %d (%d tokens) for lack of KV blocks",
                     seq.seq_id, seq.num_tokens)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.spec_token_ids.clear()
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def update(self, batch: ScheduledBatch, tokens: Seq[int | Seq[int]],
               rewind: Mapping[Sequence, int] | None = None
               ) -> list[tuple[Sequence, list[int]]]:
        """Record a finished step: ``tokens[j]`` is the next token of
        ``batch.sampled_seqs[j]``, or the tokens its verify step accepted (its proposals
        that the target kept, then one of the target's own); newly full blocks of computed
        tokens enter the prefix cache. Returns each sequence that got tokens with the
        tokens it kept (fewer when one of them finished it; some now finished).

        ``rewind`` maps sequences whose step is void (KV blocks that failed to load) to
        how many leading tokens of theirs are still valid: they go back to that point,
        drop this step's token, and recompute from there.
        """
        rewind = rewind or {}
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            if seq in rewind:
                seq.num_computed_tokens = rewind[seq]
                seq.spec_token_ids.clear()
                continue
            seq.num_computed_tokens += num_new - len(seq.spec_token_ids)
            if not seq.spec_token_ids:
                self.block_manager.cache_full_blocks(seq)
        advanced = []
        for seq, sampled in zip(batch.sampled_seqs, tokens, strict=True):
            if seq in rewind:
                if seq.logprobs:  # the runner recorded the dropped token's
                    seq.logprobs.pop()
                continue
            kept, reason = self._append(seq, [sampled] if isinstance(sampled, int)
                                        else list(sampled))
            if seq.spec_token_ids:
                seq.spec_token_ids.clear()
                # the step computed the accepted proposals' KV; the last token's is next
                seq.num_computed_tokens = seq.num_tokens - 1
                self.block_manager.cache_full_blocks(seq)
                self.block_manager.trim(seq, seq.num_tokens)
            advanced.append((seq, kept))
            if reason is not None:
                self.finish(seq, reason)
        return advanced

    def _append(self, seq: Sequence, tokens: list[int]) -> tuple[list[int], FinishReason | None]:
        """Append ``tokens`` to ``seq`` up to the first that finishes it; returns those
        appended and the reason it finished (None: it goes on)."""
        for count, token in enumerate(tokens, 1):
            seq.token_ids.append(token)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                return tokens[:count], reason
        return tokens, None

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.sampling
        if token in params.stop_token_ids:
            seq.stop_reason = token
            return FinishReason.STOP
        if not params.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Finish ``seq`` (running or waiting) now and free its blocks."""
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
