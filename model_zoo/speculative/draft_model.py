"""``DraftModelProposer``: a smaller model of the same vocabulary proposes, greedily.

The draft is built like the target (same platform, dtype, attention backend, block size;
:func:`~hwplug.model_zoo.context.build_model`) from ``model`` (default: the target's own
checkpoint), keeping its first ``num_layers`` layers when given (a truncated copy: the
weights of later layers are not loaded). It has its own KV cache, as many blocks as the
target's, its own :class:`BlockManager` and :class:`ModelRunner` (decode steps replay step
graphs where the target's do). Each sequence has a draft twin: before proposing, the twin
takes the target's tokens, keeps the KV of the prefix both agree on and gives back the
blocks past it (the rejected proposals'), then computes what it lacks and proposes
``k`` tokens by ``k`` greedy steps over every sequence at once. Greedy proposals are
deterministic (a point mass), which keeps the rejection sampler exact for sampled
requests too.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwplug import checks
from hwplug.errors import ConfigError
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.engine.block_manager import BlockManager
from hwplug.model_zoo.engine.model_runner import GraphLimits, ModelRunner
from hwplug.model_zoo.engine.scheduler import ScheduledBatch
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.model_zoo.speculative.proposer import Proposal, Proposer, ProposerTarget

if TYPE_CHECKING:
    import torch

    from hwplug.model_zoo.speculative.config import SpeculativeConfig

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclass
class TruncatedCheckpoint:
    """``checkpoint`` with only its first ``num_layers`` decoder layers (config and
    weights), for :func:`build_model`."""

    checkpoint: Any
    num_layers: int

    def __post_init__(self) -> None:
        total = int(self.checkpoint.config.num_hidden_layers)
        if self.num_layers > total:
            raise ConfigError(f"speculative_config['num_layers'] must be at most the draft "
                              f"model's {total} layers, got {self.num_layers}")
        self.config = copy.deepcopy(self.checkpoint.config)
        self.config.num_hidden_layers = self.num_layers

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.checkpoint.weights():
            layer = _LAYER.search(name)
            if layer is None or int(layer.group(1)) < self.num_layers:
                yield name, tensor


def _model(name: str, value: Any) -> Any:
    return checks.text(none="the target's model")(name, value)


class DraftModelProposer(Proposer):
    """Greedy proposals of a draft model (see the module docstring)."""

    options = {"model": (None, _model),
               "num_layers": (None, checks.integer(1, none="all of the draft's layers"))}

    def __init__(self, config: SpeculativeConfig, target: ProposerTarget) -> None:
        super().__init__(config, target)
        from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

        path = resolve_model(config.options["model"] or target.options.model)
        checkpoint = load_checkpoint(path, dequantize=target.options.dequantize)
        vocab = int(checkpoint.config.vocab_size)
        if vocab != target.vocab_size:
            raise ConfigError(f"the draft model {path} has a vocabulary of {vocab} tokens, the "
                              f"target {target.vocab_size}: a draft needs the same tokenizer")
        if config.options["num_layers"] is not None:
            checkpoint = TruncatedCheckpoint(checkpoint, config.options["num_layers"])
        self.model, self.ctx = build_model(checkpoint, platform=target.ctx.platform,
                                           config=target.options)
        block_size = self.ctx.engine_config.block_size
        self.blocks = BlockManager(target.num_blocks, block_size, enable_prefix_caching=False)
        limits = GraphLimits(target.options.max_num_seqs, target.max_model_len)
        self.runner = ModelRunner(self.model, self.ctx, target.num_blocks,
                                  step_graphs=limits if target.options.step_graphs else None)
        #: target sequence id -> (its draft twin, how many of its tokens the twin took).
        self._twins: dict[int, tuple[Sequence, int]] = {}

    def propose(self, seqs: Seq[Sequence], limits: Seq[int]) -> Proposal:
        twins = [self._sync(seq) for seq in seqs]
        wanted = dict(zip(map(id, twins), limits, strict=True))
        lengths = [twin.num_tokens for twin in twins]
        running = twins
        for _ in range(max(limits, default=0)):
            batch = ScheduledBatch()
            for twin in running:
                if self.blocks.allocate(twin, twin.num_uncomputed_tokens):
                    batch.add(twin, twin.num_uncomputed_tokens)
            if not batch:
                break
            tokens = self.runner.step(batch)
            for twin, num_new, token in zip(batch.seqs, batch.num_new_tokens, tokens,
                                            strict=True):
                twin.num_computed_tokens += num_new
                twin.token_ids.append(token)
            running = [twin for twin, length in zip(twins, lengths, strict=True)
                       if twin in batch.seqs and twin.num_tokens - length < wanted[id(twin)]]
        return Proposal([twin.token_ids[length:] for twin, length in zip(twins, lengths,
                                                                          strict=True)])

    def _sync(self, seq: Sequence) -> Sequence:
        """``seq``'s twin holding ``seq``'s tokens, its KV kept for the prefix both share
        (at least one token left to compute), the blocks past that given back."""
        twin, synced = self._twins.get(seq.seq_id, (None, 0))
        if twin is None:
            twin = Sequence(seq.token_ids)
        else:
            common = synced
            for mine, theirs in zip(twin.token_ids[synced:], seq.token_ids[synced:],
                                    strict=False):
                if mine != theirs:
                    break
                common += 1
            twin.token_ids = list(seq.token_ids)
            twin.num_computed_tokens = min(twin.num_computed_tokens, common)
        twin.num_computed_tokens = min(twin.num_computed_tokens, twin.num_tokens - 1)
        self.blocks.trim(twin, twin.num_computed_tokens)
        self._twins[seq.seq_id] = (twin, seq.num_tokens)
        return twin

    def release(self, seq: Sequence) -> None:
        twin, _ = self._twins.pop(seq.seq_id, (None, 0))
        if twin is not None:
            self.blocks.free(twin)

    def describe(self) -> str:
        return f"{super().describe()} ({self.model.num_layers} layers)"
