"""Connectors must round-trip KV blocks: blocks saved by hash load back, bit for bit,
into the block ids the metadata names, in every registered KV-cache layout.

For each registered layout (``NHD`` first), the kit builds the connector as
``cls(layout, **cls.conformance_config(workdir))`` for a small ``KVLayout`` of that layout
and an empty temporary ``workdir`` (a connector whose
``conformance_config`` is None, or that still needs options the kit cannot guess, i.e.
raises :class:`~hwplug.errors.ConfigError`, is "not checked here"), saves two blocks of every layer of a random cache for one request
(its full blocks, named by chained hashes), waits, then requires
``get_num_new_matched_tokens`` to count both blocks (and none of a request it never saw),
loads them into two *other* block ids of zeroed caches, waits per layer, and requires no
load errors, the blocks back bit for bit where the metadata put them, and every other
block untouched. The caches have the layout's shape and blocks are compared through the
layout object (``select_blocks``), so a connector that indexes a dimension instead of
asking the layout fails in a layout whose blocks lie elsewhere.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from hwplug import registries
from hwplug.conformance.execution import Observed, ran_on
from hwplug.conformance.result import Check, CheckResult, Outcome, Status
from hwplug.conformance.target import Placement
from hwplug.connector import (
    BlockTransfer,
    Connector,
    ConnectorMetadata,
    ConnectorRequest,
    KVLayout,
)
from hwplug.errors import ConfigError
from hwplug.kv_cache_layout import REFERENCE_LAYOUT, registered_layout

LAYOUT = KVLayout(backend="TORCH_PAGED", layout="NHD", kv_cache_dtype="float32", block_size=4,
                  num_kv_heads=2, head_size=8, num_layers=2)
NUM_BLOCKS = 6
#: Where the request's two blocks are saved from, and where they are loaded back into.
SAVED, LOADED = [1, 4], [5, 2]
REQUEST = "conformance-0"


def _chained_hashes(count: int, seed: str) -> tuple[str, ...]:
    hashes, parent = [], seed
    for index in range(count):
        parent = hashlib.sha256(f"{parent}:{index}".encode()).hexdigest()
        hashes.append(parent)
    return tuple(hashes)


def _round_trip(connector: Connector, placement: Placement, observed: Observed) -> str | None:
    """What went wrong in one save-then-load, or None; the caches loaded into are recorded
    in ``observed``."""
    rng = torch.Generator().manual_seed(0)
    layout = connector.cache_layout
    shape = layout.shape(NUM_BLOCKS, LAYOUT.block_size, connector.layout.num_kv_heads,
                         LAYOUT.head_size)
    caches = {f"layers.{i}": torch.randn(shape, generator=rng).to(placement.device)
              for i in range(LAYOUT.num_layers)}
    originals = {name: cache.clone() for name, cache in caches.items()}
    hashes = _chained_hashes(len(SAVED), f"{REQUEST}:{connector.layout.layout}")  # per layout
    request = ConnectorRequest(REQUEST, len(SAVED) * LAYOUT.block_size, hashes)
    saves = ConnectorMetadata(connector.fingerprint, saves={
        REQUEST: [BlockTransfer(h, b) for h, b in zip(hashes, SAVED, strict=True)]})
    for name, cache in caches.items():
        connector.save_kv_layer(name, cache, saves)
    connector.wait_for_save()
    matched = connector.get_num_new_matched_tokens(request, 0)
    if matched != request.num_tokens:
        return (f"get_num_new_matched_tokens says {matched} tokens after saving "
                f"{len(SAVED)} blocks of {LAYOUT.block_size}")
    stranger = ConnectorRequest("conformance-unknown", 8, _chained_hashes(2, "unknown"))
    if connector.get_num_new_matched_tokens(stranger, 0):
        return "get_num_new_matched_tokens matches blocks that were never saved"
    for cache in caches.values():
        cache.zero_()
    connector.start_load_kv(ConnectorMetadata(connector.fingerprint, loads={
        REQUEST: [BlockTransfer(h, b) for h, b in zip(hashes, LOADED, strict=True)]}), caches)
    for name in caches:
        connector.wait_for_layer_load(name)
    observed.tensors(caches)
    errors = connector.get_block_ids_with_load_errors()
    if errors:
        return f"reports load errors for blocks {sorted(errors)}"
    others = [b for b in range(NUM_BLOCKS) if b not in LOADED]
    for name, cache in caches.items():
        if not torch.equal(layout.select_blocks(cache, LOADED),
                           layout.select_blocks(originals[name], SAVED)):
            return (f"{name}: blocks saved from ids {SAVED} differ when loaded into "
                    f"ids {LOADED}")
        if bool(layout.select_blocks(cache, others).any()):
            return f"{name}: loading into blocks {LOADED} wrote into other blocks"
    return None


def _outcome(cls: type[Connector], placement: Placement) -> Outcome:
    names = sorted(registries.kv_layouts.names(), key=lambda n: n != REFERENCE_LAYOUT)
    observed = Observed()
    for name in names:
        with tempfile.TemporaryDirectory(prefix="hwplug-connector-") as workdir:
            options = cls.conformance_config(Path(workdir))
            if options is None:
                return "not checked", ("says it cannot be checked alone "
                                       "(conformance_config is None)")
            status, detail = _checked(cls, options, placement, name, observed)
        if status != "passed":
            return status, detail
    status, simulation = ran_on(placement, observed, cls.__module__)
    return status, (f"blocks {SAVED} of {LAYOUT.num_layers} layers saved by hash and loaded "
                    f"into {LOADED} bit for bit, in layouts {', '.join(names)} "
                    f"{placement.describe()}"), simulation


def _checked(cls: type[Connector], options: dict, placement: Placement, layout: str,
             observed: Observed) -> tuple[Status, str]:
    try:
        # a latent cache (MLA) holds one KV head
        heads = LAYOUT.num_kv_heads if registered_layout(layout).holds_values else 1
        connector = cls(replace(LAYOUT, layout=layout, num_kv_heads=heads), **options)
    except ConfigError as exc:
        return "not checked", f"cannot be built without options the kit cannot guess: {exc}"
    try:
        problem = _round_trip(connector, placement, observed)
        connector.request_finished(REQUEST)
    except Exception as exc:  # e.g. indexing the cache where this layout keeps no blocks
        problem = f"raised {exc!r}"
    finally:
        connector.close()
    return ("failed", f"layout {layout}: {problem}") if problem else ("passed", "")


def connector_check(name: str, load: Callable[[], type[Connector]],
                    placement: Placement) -> Check:
    """The round-trip check of connector ``name`` (``load`` imports its class when run)."""
    return Check(f"connector {name}", lambda: _outcome(load(), placement))


def check_connector(cls: type[Connector], placement: Placement | None = None) -> CheckResult:
    """Check connector class ``cls`` now, on CPU unless ``placement`` says otherwise."""
    return connector_check(cls.get_name(), lambda: cls, placement or Placement()).run()
