"""Running a model-zoo model over a batch without the engine (for the model tests).

:class:`PagedBatch` gives every sequence its own run of cache blocks (shuffled, so block
tables matter) and builds the :class:`AttentionMetadata` of a step in which sequence i
appends ``query_lens[i]`` tokens to a context of ``context_lens[i]`` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hwplug.attention import AttentionMetadata
from hwplug.dtypes import torch_dtype
from hwplug.model_zoo.context import InMemoryCheckpoint, ModelContext

__all__ = ["InMemoryCheckpoint", "PagedBatch"]


class PagedBatch:
    """KV caches for ``num_seqs`` sequences of up to ``max_len`` tokens, one per layer."""

    def __init__(self, ctx: ModelContext, num_layers: int, num_seqs: int, max_len: int,
                 seed: int = 0) -> None:
        engine = ctx.engine_config
        self.block_size = engine.block_size
        blocks_per_seq = math.ceil(max_len / self.block_size)
        num_blocks = num_seqs * blocks_per_seq
        shape = ctx.attention_backend.kv_cache_shape(num_blocks, self.block_size,
                                                     engine.num_kv_heads, engine.head_size)
        self.kv_caches = [torch.zeros(shape, dtype=torch_dtype(engine.kv_cache_dtype))
                          for _ in range(num_layers)]
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
        self.block_tables = order.to(torch.int32).view(num_seqs, blocks_per_seq)

    def step(self, context_lens: Sequence[int], query_lens: Sequence[int]
             ) -> tuple[torch.Tensor, AttentionMetadata]:
        """Positions ``[T]`` and metadata for queries that are the last ``query_lens[i]`` of
        ``context_lens[i]`` tokens of sequence i (sequences in order 0..len-1)."""
        positions = torch.cat([torch.arange(c - q, c)
                               for c, q in zip(context_lens, query_lens, strict=True)])
        seq_ids = torch.repeat_interleave(torch.arange(len(query_lens)), torch.tensor(query_lens))
        blocks = self.block_tables[seq_ids, positions // self.block_size].long()
        slots = blocks * self.block_size + positions % self.block_size
        starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
        metadata = AttentionMetadata(
            slot_mapping=slots, block_tables=self.block_tables[:len(query_lens)],
            seq_lens=torch.tensor(context_lens, dtype=torch.int32), query_start_loc=starts,
            max_query_len=max(query_lens), max_seq_len=max(context_lens))
        return positions, metadata

    def run(self, model: torch.nn.Module, chunks: Sequence[torch.Tensor],
            context_lens: Sequence[int], **kwargs: Any) -> torch.Tensor:
        """Run ``model`` on token chunks ``[q_i]`` that end contexts of ``context_lens``;
        returns the hidden states ``[sum q_i, hidden]``."""
        positions, metadata = self.step(context_lens, [len(c) for c in chunks])
        with torch.inference_mode():
            return model(torch.cat(chunks), positions, self.kv_caches, metadata, **kwargs)


def greedy_steps(model: Any, ctx: ModelContext, prompts: torch.Tensor, new_tokens: int,
                 feed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every step ``[new_tokens, B, vocab]`` and their argmax tokens ``[B,
    new_tokens]`` after ``prompts [B, L]``, through the paged cache; each step's input is its
    argmax, or ``feed``'s tokens when given (teacher forcing, so two models see the same
    inputs however their choices differ)."""
    prompt_len = prompts.shape[1]
    batch = PagedBatch(ctx, model.num_layers, len(prompts), prompt_len + new_tokens)
    chunks, lens, steps, tokens = list(prompts), [prompt_len] * len(prompts), [], []
    with torch.inference_mode():
        for step in range(new_tokens):
            hidden = batch.run(model, chunks, lens)
            last = torch.tensor([len(c) for c in chunks]).cumsum(0) - 1
            steps.append(model.compute_logits(hidden[last]))
            tokens.append(steps[-1].argmax(-1))
            fed = tokens[-1] if feed is None else feed[:, step]
            chunks, lens = [t.view(1) for t in fed], [n + 1 for n in lens]
    return torch.stack(steps), torch.stack(tokens, dim=1)
