"""Connectors must round-trip KV blocks: saving blocks then loading them restores them.

The kit builds the connector for a small ``NHD`` layout, saves two blocks of every layer
of a random cache for one request, waits, clears the caches, loads the same blocks for
the same request, waits per layer, and requires the blocks back bit for bit and every
other block untouched. Block ``b`` of a layer's cache is ``cache[:, b]``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwplug.conformance.result import Check, Status
from hwplug.conformance.target import Placement
from hwplug.connector import Connector, ConnectorMetadata, KVLayout

LAYOUT = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32", block_size=4,
                  num_kv_heads=2, head_size=8, num_layers=2)
NUM_BLOCKS = 6
BLOCKS = [1, 4]
REQUEST = "conformance-0"


def _outcome(cls: type[Connector], placement: Placement) -> tuple[Status, str]:
    connector = cls(LAYOUT)
    rng = torch.Generator().manual_seed(0)
    shape = (2, NUM_BLOCKS, LAYOUT.block_size, LAYOUT.num_kv_heads, LAYOUT.head_size)
    caches = {f"layers.{i}": torch.randn(shape, generator=rng).to(placement.device)
              for i in range(LAYOUT.num_layers)}
    originals = {name: cache.clone() for name, cache in caches.items()}
    saves = ConnectorMetadata(connector.fingerprint, saves={REQUEST: BLOCKS})
    for name, cache in caches.items():
        connector.save_kv_layer(name, cache, saves)
    connector.wait_for_save()
    for cache in caches.values():
        cache.zero_()
    connector.start_load_kv(ConnectorMetadata(connector.fingerprint, loads={REQUEST: BLOCKS}),
                            caches)
    others = [b for b in range(NUM_BLOCKS) if b not in BLOCKS]
    for name, cache in caches.items():
        connector.wait_for_layer_load(name)
        if not torch.equal(cache[:, BLOCKS], originals[name][:, BLOCKS]):
            return "failed", f"{name}: blocks {BLOCKS} differ after save then load"
        if bool(cache[:, others].any()):
            return "failed", f"{name}: loading blocks {BLOCKS} wrote into other blocks"
    return "passed", (f"blocks {BLOCKS} of {LAYOUT.num_layers} layers restored bit for bit "
                      f"{placement.describe()}")


def connector_check(name: str, load: Callable[[], type[Connector]],
                    placement: Placement) -> Check:
    """The round-trip check of connector ``name`` (``load`` imports its class when run)."""
    return Check(f"connector {name}", lambda: _outcome(load(), placement))
