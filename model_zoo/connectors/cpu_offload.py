"""``cpu_offload``: a host-memory tier for KV blocks, least recently used evicted past a cap.

Every block an engine fills is copied to host memory (up to ``max_bytes``, default 1 GiB);
a request whose prefix the device cache no longer holds loads it back instead of
recomputing it. On an accelerator this frees device blocks for running requests while
their prefixes stay one copy away; on the CPU platform the same code is a second tier
behind the prefix cache, holding what the cache evicted. Options (``kv_connector_config``):
``max_bytes``, ``load_timeout_s``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hwplug.connector import KVLayout
from hwplug.errors import ConfigError
from hwplug.model_zoo.connectors.host_store import HostBlockStore
from hwplug.model_zoo.connectors.layerwise import DEFAULT_LOAD_TIMEOUT_S, LayerwiseConnector

DEFAULT_MAX_BYTES = 2**30


class CPUOffloadConnector(LayerwiseConnector):
    """KV blocks kept in host memory by hash."""

    def __init__(self, layout: KVLayout, policy: str | None = None, *,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ConfigError(f"cpu_offload max_bytes must be a positive integer, got "
                              f"{max_bytes!r}")
        super().__init__(layout, policy, load_timeout_s=load_timeout_s)
        self.store = HostBlockStore(max_bytes)

    @classmethod
    def get_name(cls) -> str:
        return "cpu_offload"

    def _contains(self, block_hash: str) -> bool:
        return block_hash in self.store

    def _read_layer(self, layer_name: str, block_hashes: Sequence[str]
                    ) -> list[torch.Tensor | None]:
        blocks = [self.store.get(block_hash) for block_hash in block_hashes]
        return [None if block is None else block.get(layer_name) for block in blocks]

    def _write_blocks(self, blocks: dict[str, dict[str, torch.Tensor]]) -> None:
        for block_hash, layers in blocks.items():
            self.store.put(block_hash, layers)
