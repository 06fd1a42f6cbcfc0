"""Paged batches for the kit's attention inputs: where each sequence's tokens live in a
paged cache (:class:`BlockLayout`, shuffled blocks), one batch's steps (:class:`Step`) and
their metadata (:class:`PagedBatch`), and strategies of the steps engines run (decode,
speculative verify, mixed prefill/chunk/decode)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from hwplug.attention import AttentionMetadata


@dataclass(frozen=True)
class BlockLayout:
    """Where each sequence's tokens live in a paged cache: shuffled, non-contiguous blocks.

    ``tables[i]`` lists sequence i's blocks in token order; the cache has ``spare`` more
    blocks than the sequences use, so reading a wrong block reads foreign data.
    """

    block_size: int
    num_blocks: int
    tables: tuple[tuple[int, ...], ...]

    @classmethod
    def shuffled(cls, rng: torch.Generator, seq_lens: Sequence[int], block_size: int,
                 spare: int = 2) -> BlockLayout:
        counts = [math.ceil(n / block_size) for n in seq_lens]
        order = torch.randperm(sum(counts) + spare, generator=rng).tolist()
        tables, start = [], 0
        for count in counts:
            tables.append(tuple(order[start:start + count]))
            start += count
        return cls(block_size, sum(counts) + spare, tuple(tables))

    def slots(self, seq: int, start: int, stop: int) -> list[int]:
        """Cache slots of sequence ``seq``'s tokens ``start .. stop - 1``."""
        table, size = self.tables[seq], self.block_size
        return [table[t // size] * size + t % size for t in range(start, stop)]

    def table_tensor(self, pad: int = 0) -> torch.Tensor:
        """``[B, max_blocks]`` int32 block table, short rows padded with ``pad``."""
        width = max(len(t) for t in self.tables)
        rows = [list(t) + [pad] * (width - len(t)) for t in self.tables]
        return torch.tensor(rows, dtype=torch.int32)


@dataclass(frozen=True)
class Step:
    """One batch of a sequence: ``new`` tokens after ``context`` already cached ones."""

    context: int
    new: int


@dataclass
class PagedBatch:
    """The paged-attention metadata of one batch of steps over a :class:`BlockLayout`."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32, context + new
    query_start_loc: torch.Tensor  # [B + 1] int32
    max_query_len: int
    max_seq_len: int
    label: str = ""

    @classmethod
    def build(cls, layout: BlockLayout, steps: Sequence[Step], pad: int = 0) -> PagedBatch:
        """Metadata for ``steps[i]`` of sequence i (a step with ``new == 0`` is left out)."""
        active = [(i, s) for i, s in enumerate(steps) if s.new > 0]
        slots = [slot for i, s in active for slot in layout.slots(i, s.context, s.context + s.new)]
        lens = [s.context + s.new for _, s in active]
        starts = [0]
        for _, s in active:
            starts.append(starts[-1] + s.new)
        sub = BlockLayout(layout.block_size, layout.num_blocks,
                          tuple(layout.tables[i] for i, _ in active))
        label = "[" + ", ".join(_describe(s) for _, s in active) + "]"
        return cls(torch.tensor(slots, dtype=torch.int64), sub.table_tensor(pad),
                   torch.tensor(lens, dtype=torch.int32),
                   torch.tensor(starts, dtype=torch.int32),
                   max(s.new for _, s in active), max(lens), label)

    def metadata(self, device: str | torch.device = "cpu") -> AttentionMetadata:
        """The batch as the ops take it, its tensors on ``device``."""
        return AttentionMetadata(
            self.slot_mapping.to(device), self.block_tables.to(device),
            self.seq_lens.to(device), self.query_start_loc.to(device), self.max_query_len,
            self.max_seq_len)


def _describe(step: Step) -> str:
    if step.context == 0:
        return f"prefill {step.new}"
    if step.new == 1:
        return f"decode at {step.context}"
    return f"chunk {step.new} after {step.context}"


def decode_step() -> st.SearchStrategy[Step]:
    """One new token after a short context."""
    return st.builds(Step, st.integers(1, 40), st.just(1))


def verify_step() -> st.SearchStrategy[Step]:
    """A speculative verify step: up to 6 new tokens (k + 1, or 1 without proposals) after
    a short context."""
    return st.builds(Step, st.integers(1, 40), st.integers(1, 6))


def mixed_step() -> st.SearchStrategy[Step]:
    """A prefill, a chunked-prefill chunk or a decode step, with a short context."""
    return st.one_of(st.builds(Step, st.just(0), st.integers(1, 24)),
                     st.builds(Step, st.integers(1, 20), st.integers(2, 12)),
                     decode_step())
