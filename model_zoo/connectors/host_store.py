"""``HostBlockStore``: KV blocks in host memory, least recently used evicted past a byte cap."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

#: One block: layer name -> that layer's block, a one-block cache in the engine's layout.
Block = dict[str, torch.Tensor]


class HostBlockStore:
    """Blocks by chained hash; thread-safe. A block larger than the cap is not kept."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._blocks: OrderedDict[str, Block] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, block_hash: object) -> bool:
        with self._lock:
            return block_hash in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, block_hash: str) -> Block | None:
        """The block (now the most recently used), or None."""
        with self._lock:
            block = self._blocks.get(block_hash)
            if block is not None:
                self._blocks.move_to_end(block_hash)
            return block

    def put(self, block_hash: str, block: Block) -> None:
        """Keep ``block`` (replacing one held under the same hash), evicting the least
        recently used ones to stay within the cap."""
        size = sum(tensor.nbytes for tensor in block.values())
        with self._lock:
            replaced = self._blocks.pop(block_hash, None)
            if replaced is not None:
                self.nbytes -= sum(tensor.nbytes for tensor in replaced.values())
            if size > self.max_bytes:
                return
            while self.nbytes + size > self.max_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self.nbytes -= sum(tensor.nbytes for tensor in evicted.values())
            self._blocks[block_hash] = block
            self.nbytes += size
