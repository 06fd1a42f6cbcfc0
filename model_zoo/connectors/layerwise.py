"""``LayerwiseConnector``: the loading and saving machinery hwplug's connectors share.

A subclass says what its store holds (``_contains``), how to read one layer of some blocks
(``_read_layer``, with ``_start_reading``/``_finish_reading`` around a load) and how to
store whole blocks (``_write_blocks``). This base:

- answers :meth:`get_num_new_matched_tokens` by counting consecutive stored hashes;
- loads on a thread of its own, layer after layer in the engine's order, each layer's
  blocks converted into the engine's layout when written under another and checked
  (shape, dtype) before they are written into the cache, and signals each layer as it
  is done, so :meth:`wait_for_layer_load` returns as soon as the layer the
  model is about to run is in place;
- records every block that could not be read, or failed a check, in any layer
  (:meth:`get_block_ids_with_load_errors`), with the reason in the log; such a block is
  no longer offered (:meth:`get_num_new_matched_tokens`) and the next save of its hash
  replaces it, so a bad block is rewritten by its recomputation instead of failing again;
- saves by copying a layer's new blocks to host memory when the engine hands the layer
  over (blocks the store already holds, good, are skipped) and storing whole blocks in
  :meth:`wait_for_save`.

A load that does not finish within ``load_timeout_s`` counts as failed; the thread is told
to stop writing into the cache. Every block moves through the engine's layout object
(:attr:`~hwplug.connector.Connector.cache_layout`): one block of one layer is a one-block
cache of that layout (``select_blocks``), and loads go back with ``write_blocks``.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections.abc import Sequence
from typing import Any

import torch

from hwplug import checks
from hwplug.connector import (
    BlockTransfer,
    Connector,
    ConnectorMetadata,
    ConnectorRequest,
    KVLayout,
    layout_converter,
)

__all__ = ["DEFAULT_LOAD_TIMEOUT_S", "LayerwiseConnector"]

logger = logging.getLogger(__name__)

#: Seconds a layer's load may take before its blocks count as failed.
DEFAULT_LOAD_TIMEOUT_S = 120.0


class LayerwiseConnector(Connector):
    """Base of hwplug's connectors (abstract: see the module docstring)."""

    def __init__(self, layout: KVLayout, policy: str | None = None, *,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        super().__init__(layout, policy)
        self._load_timeout_s = checks.real(0, threading.TIMEOUT_MAX, low_open=True)(
            "kv_connector_config load_timeout_s", load_timeout_s)
        self._layer_done: dict[str, threading.Event] = {}
        self._failed: set[int] = set()
        self._load_ids: list[int] = []
        self._load_hashes: dict[int, str] = {}
        #: Hashes of stored blocks that failed to load: offered no more, rewritten on save.
        self._bad: set[str] = set()
        self._cancel = threading.Event()
        self._staged: dict[str, tuple[list[str], torch.Tensor]] = {}

    # --- what a store implements ----------------------------------------------------------

    @abc.abstractmethod
    def _contains(self, block_hash: str) -> bool:
        """Whether the store holds the block."""

    def _start_reading(self, block_hashes: Sequence[str]) -> None:
        """Prepare to read these blocks (open files, ask a peer); on the load thread."""

    @abc.abstractmethod
    def _read_layer(self, layer_name: str, block_hashes: Sequence[str]
                    ) -> list[torch.Tensor | None]:
        """One layer of each block, a one-block cache in this connector's layout (None: not
        readable)."""

    def _finish_reading(self) -> None:
        """Release what :meth:`_start_reading` took."""

    @abc.abstractmethod
    def _write_blocks(self, blocks: dict[str, dict[str, torch.Tensor]]) -> None:
        """Store whole blocks: block hash -> layer name -> the layer's block, a one-block
        cache in this connector's layout (a new tensor on the host: a store may keep it)."""

    def _converted(self, blocks: torch.Tensor, source: KVLayout) -> torch.Tensor:
        """``blocks`` written under ``source`` as this connector's layout reads them
        (raises :class:`~hwplug.connector.KVLayoutMismatchError` if they cannot be)."""
        return layout_converter(source, self.layout)(blocks, source, self.layout)

    def _holds(self, block_hash: str) -> bool:
        """Whether the store holds the block and it has not failed to load."""
        return block_hash not in self._bad and self._contains(block_hash)

    # --- the Connector interface ------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: ConnectorRequest,
                                   num_computed_tokens: int) -> int:
        size = self.layout.block_size
        found = 0
        for block_hash in request.block_hashes[num_computed_tokens // size:]:
            if not self._holds(block_hash):
                break
            found += 1
        return found * size

    def start_load_kv(self, metadata: ConnectorMetadata, kv_caches: dict[str, Any]) -> None:
        transfers = [t for group in metadata.loads.values() for t in group]
        self._load_ids = [t.block_id for t in transfers]
        self._load_hashes = {t.block_id: t.block_hash for t in transfers}
        self._failed = set()
        self._cancel.clear()
        self._layer_done = {name: threading.Event() for name in kv_caches}
        if transfers:
            threading.Thread(target=self._load, args=(transfers, kv_caches),
                             name=f"hwplug-{self.get_name()}-load", daemon=True).start()
        else:
            for event in self._layer_done.values():
                event.set()

    def wait_for_layer_load(self, layer_name: str) -> None:
        event = self._layer_done.get(layer_name)
        if event is not None and not event.wait(self._load_timeout_s):
            self._cancel.set()
            for other in self._layer_done.values():
                other.set()
            self._mark_failed(self._load_ids)
            logger.warning("%s: loading %s took over %.0f s; its blocks count as failed",
                           self.get_name(), layer_name, self._load_timeout_s)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set(self._failed)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      metadata: ConnectorMetadata) -> None:
        unique: dict[str, int] = {}
        for group in metadata.saves.values():
            for transfer in group:
                if transfer.block_hash not in unique and not self._holds(transfer.block_hash):
                    unique[transfer.block_hash] = transfer.block_id
        if unique:
            blocks = self.cache_layout.select_blocks(kv_layer, list(unique.values()))
            self._staged[layer_name] = (list(unique), blocks.cpu())

    def wait_for_save(self) -> None:
        staged, self._staged = self._staged, {}
        if not staged:
            return
        hashes = next(iter(staged.values()))[0]
        select = self.cache_layout.select_blocks
        self._write_blocks({block_hash: {name: select(blocks, [j]) for name, (_, blocks)
                                         in staged.items()}
                            for j, block_hash in enumerate(hashes)})
        self._bad.difference_update(hashes)

    # --- the load thread ------------------------------------------------------------------

    def _load(self, transfers: list[BlockTransfer], kv_caches: dict[str, Any]) -> None:
        hashes = [t.block_hash for t in transfers]
        ids = [t.block_id for t in transfers]
        try:
            self._start_reading(hashes)
        except Exception as exc:
            self._fail(ids, f"cannot start reading: {exc}")
        try:
            for name, cache in kv_caches.items():
                try:
                    if len(self._failed) < len(ids) and not self._cancel.is_set():
                        self._place(name, cache, hashes, ids)
                except Exception as exc:
                    self._fail(ids, f"{name}: {exc}")
                finally:
                    self._layer_done[name].set()
        finally:
            self._finish_reading()

    def _place(self, name: str, cache: torch.Tensor, hashes: list[str], ids: list[int]) -> None:
        blocks = self._read_layer(name, hashes)
        layout = self.cache_layout
        expected = tuple(layout.select_blocks(cache, ids[:1]).shape)  # one block
        good_ids, good, bad_ids, reasons = [], [], [], []
        for block_hash, block_id, block in zip(hashes, ids, blocks, strict=True):
            if block_id in self._failed:
                continue
            if block is None:
                bad_ids.append(block_id)
                reasons.append(f"block {block_hash[:12]} is not readable")
            elif tuple(block.shape) != expected or block.dtype != cache.dtype:
                bad_ids.append(block_id)
                reasons.append(f"block {block_hash[:12]} is {tuple(block.shape)} "
                               f"{block.dtype}, the cache's are {expected} {cache.dtype}")
            else:
                good_ids.append(block_id)
                good.append(block)
        if bad_ids:
            self._fail(bad_ids, f"{name}: {'; '.join(reasons[:3])}"
                                f"{' ...' if len(reasons) > 3 else ''}")
        if good and not self._cancel.is_set():
            layout.write_blocks(cache, good_ids, layout.join_blocks(good))

    def _fail(self, block_ids: list[int], reason: str) -> None:
        logger.warning("%s: %d KV blocks not loaded: %s", self.get_name(), len(block_ids),
                       reason)
        self._mark_failed(block_ids)

    def _mark_failed(self, block_ids: list[int]) -> None:
        self._failed.update(block_ids)
        self._bad.update(self._load_hashes[i] for i in block_ids if i in self._load_hashes)
