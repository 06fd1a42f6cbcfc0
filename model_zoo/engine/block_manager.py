"""``BlockManager``: hands out fixed-size KV-cache blocks from a free list.

The KV cache of every layer is ``num_blocks`` blocks of ``block_size`` token slots; a
sequence's ``block_table`` lists the blocks holding its tokens in order, so token ``p``
lives in slot ``block_table[p // block_size] * block_size + p % block_size``. Blocks are
allocated before a step computes new tokens and freed when a sequence finishes or is
preempted. Allocation is all or nothing: a request the free list cannot cover changes
nothing and returns False (the scheduler then preempts).
"""

from __future__ import annotations

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.sequence import Sequence


class BlockManager:
    """The free list of ``num_blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(f"need at least one block of at least one token, got "
                             f"{num_blocks} blocks of {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        # a stack: the most recently freed (still cache-warm) block is reused first
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Grow ``seq.block_table`` to hold its computed tokens plus ``num_new_tokens``.

        Returns False, allocating nothing, when too few blocks are free.
        """
        needed = (self.blocks_for(seq.num_computed_tokens + num_new_tokens)
                  - len(seq.block_table))
        if needed > len(self._free):
            return False
        if needed > 0:
            seq.block_table.extend(self._free[-needed:])
            del self._free[-needed:]
        return True

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks to the free list and empty its table."""
        self._free.extend(reversed(seq.block_table))
        seq.block_table.clear()
