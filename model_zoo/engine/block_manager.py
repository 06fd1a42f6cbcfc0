"""``BlockManager``: fixed-size KV-cache blocks, with prefix caching.

The KV cache of every layer is ``num_blocks`` blocks of ``block_size`` token slots; a
sequence's ``block_table`` lists the blocks holding its tokens in order, so token ``p``
lives in slot ``block_table[p // block_size] * block_size + p % block_size``. Blocks are
allocated before a step computes new tokens and released when a sequence finishes or is
preempted. Allocation is all or nothing: a request the free blocks cannot cover changes
nothing and returns False (the scheduler then preempts).

Prefix caching (on unless ``enable_prefix_caching=False``): once all of a block's tokens
are computed, the block is registered under its chained hash
(:mod:`~hwplug.model_zoo.engine.block_hash`). A block is reference-counted; released
blocks stay cached and go to the back of the free queue, so eviction takes the least
recently released first, while blocks holding nothing reusable (a partial last block) go
to the front and are reused first. A new sequence whose leading blocks are cached starts
from them (:meth:`cached_prefix`), computing at least its last token itself. Registering
and evicting record :class:`~hwplug.model_zoo.engine.kv_events.BlockStored` and
:class:`~hwplug.model_zoo.engine.kv_events.BlockRemoved` on the event bus.
"""

from __future__ import annotations

from collections import OrderedDict

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.block_hash import block_extra_keys, extend_block_hashes
from hwplug.model_zoo.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBus,
)
from hwplug.model_zoo.engine.sequence import Sequence


class BlockManager:
    """``num_blocks`` blocks of ``block_size`` tokens; a prefix cache keyed by block hash."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 events: KVEventBus | None = None) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(f"need at least one block of at least one token, got "
                              f"{num_blocks} blocks of {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.events = events or KVEventBus()
        self._refs = [0] * num_blocks
        self._hash: list[str | None] = [None] * num_blocks
        self._cached: dict[str, int] = {}  # block hash -> block id
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        #: Blocks sequences started from because they were cached (prefix-cache hits).
        self.num_hit_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence uses (cached ones among them can be evicted)."""
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def hash_blocks(self, seq: Sequence) -> None:
        """Name ``seq``'s full blocks of tokens not yet named (``seq.block_hashes``)."""
        extend_block_hashes(seq.block_hashes, seq.root_hash, seq.token_ids, self.block_size,
                            seq.sampling.cache_salt)

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Ids of the cached blocks that hold ``seq``'s leading full blocks (none when
        caching is off or the sequence asks for prompt log-probabilities, which need
        every prompt position computed). At least one token is always left to compute."""
        if not self.enable_prefix_caching or seq.prompt_logprobs is not None:
            return []
        self.hash_blocks(seq)
        limit = (seq.num_tokens - 1) // self.block_size
        found = []
        for block_hash in seq.block_hashes[:limit]:
            block = self._cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def allocate(self, seq: Sequence, num_new_tokens: int, prefix: list[int] = ()) -> bool:
        """Grow ``seq.block_table`` to hold its computed tokens plus ``num_new_tokens``.

        ``prefix`` (a sequence without blocks only) are cached blocks it starts from
        (:meth:`cached_prefix`); they count among the tokens to hold. Returns False,
        allocating nothing, when too few blocks are free.
        """
        held = len(seq.block_table) + len(prefix)
        tokens = seq.num_computed_tokens + len(prefix) * self.block_size + num_new_tokens
        needed = self.blocks_for(tokens) - held
        reclaimed = sum(1 for block in prefix if self._refs[block] == 0)
        if needed > len(self._free) - reclaimed:
            return False
        for block in prefix:
            self._take(block)
        seq.block_table.extend(prefix)
        seq.num_cached_blocks += len(prefix)
        self.num_hit_blocks += len(prefix)
        for _ in range(max(needed, 0)):
            block = next(iter(self._free))
            self._evict(block)
            self._take(block)
            seq.block_table.append(block)
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register ``seq``'s blocks that are now fully computed under their hashes (a
        hash another block already holds is left unregistered)."""
        start = seq.num_cached_blocks
        full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or full <= start:
            seq.num_cached_blocks = max(start, full)
            return
        self.hash_blocks(seq)
        stored = []
        for index in range(start, full):
            block, block_hash = seq.block_table[index], seq.block_hashes[index]
            if block_hash not in self._cached and self._hash[block] is None:
                self._cached[block_hash] = block
                self._hash[block] = block_hash
                stored.append(index)
        seq.num_cached_blocks = full
        if stored and self.events.active:
            self._record_stored(seq, stored)

    def _record_stored(self, seq: Sequence, indices: list[int]) -> None:
        size = self.block_size
        first = indices[0]
        self.events.record(BlockStored(
            block_hashes=[seq.block_hashes[i] for i in indices],
            parent_block_hash=seq.block_hashes[first - 1] if first else seq.root_hash,
            token_ids=[t for i in indices for t in seq.token_ids[i * size:(i + 1) * size]],
            block_size=size,
            extra_keys=[block_extra_keys(i, seq.sampling.cache_salt) for i in indices]))

    def free(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks and empty its table; cached ones stay cached."""
        self.trim(seq, 0)
        seq.num_cached_blocks = 0

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release ``seq``'s blocks past those holding its first ``num_tokens`` tokens (a
        verify step's rejected proposals: their slots hold KV of tokens the sequence does
        not have, never registered in the prefix cache)."""
        keep = self.blocks_for(num_tokens)
        for block in reversed(seq.block_table[keep:]):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:  # holds nothing reusable: reuse it first
                    self._free.move_to_end(block, last=False)
        del seq.block_table[keep:]

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False (nothing done) while any block is in use."""
        if len(self._free) != self.num_blocks:
            return False
        self._cached.clear()
        self._hash = [None] * self.num_blocks
        if self.events.active:
            self.events.record(AllBlocksCleared())
        return True

    def _take(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._free[block]
        self._refs[block] += 1

    def _evict(self, block: int) -> None:
        block_hash = self._hash[block]
        if block_hash is None:
            return
        self._hash[block] = None
        del self._cached[block_hash]
        if self.events.active:
            self.events.record(BlockRemoved([block_hash]))
