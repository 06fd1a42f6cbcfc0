"""``KVTransfer``: the engine's side of a :class:`~hwplug.connector.Connector`.

It answers the scheduler's question for a sequence that starts (how many tokens past its
cached prefix can the connector load: whole blocks, always leaving one token to compute),
collects the step's loads and saves into one :class:`~hwplug.connector.ConnectorMetadata`
(saves: every block the step fills, prompt or generated tokens alike), and hooks every
attention layer of the model: before layer ``i`` runs, it waits for that layer's loads
(``layers.i``), so loading overlaps the layers before it. A step that loads must
therefore run eagerly, layer by layer (:attr:`KVTransfer.loading`): a replayed step graph
runs no Python hooks and would read blocks still being loaded.

After the step it settles the loads first: load failures become rewind points (the
sequence goes back to its first block that failed, and, by the connector's
``kv_load_failure_policy``, recomputes from there, ``recompute``, or ends with a
:class:`~hwplug.connector.KVTransferError`, ``fail``). Only then does it save, layer by
layer (``save_kv_layer``, then ``wait_for_save``), the blocks of the sequences whose
inputs were good: what a step computed over KV that failed to load is never saved, and
nothing is saved from a step that raised.

Sequences that ask for prompt log-probabilities never load (every prompt position must be
computed), as with prefix caching. The engine's :class:`~hwplug.connector.KVLayout` names
its backend's registered KV-cache layout; the connector reaches the blocks of every
layer's cache through that layout object (``Connector.cache_layout``).
"""

from __future__ import annotations

import logging
from typing import Any

from hwplug import registries
from hwplug.connector import (
    BlockTransfer,
    Connector,
    ConnectorMetadata,
    ConnectorRequest,
    KVLayout,
    KVTransferError,
)
from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.block_manager import BlockManager
from hwplug.model_zoo.engine.scheduler import ScheduledBatch
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.model_zoo.layers.attention import Attention

logger = logging.getLogger(__name__)


def engine_kv_layout(ctx: Any, model: Any) -> KVLayout:
    """The :class:`KVLayout` of ``model``'s caches under ``ctx``: backend, layout, dtype,
    block size, geometry, layers and, for fp8 caches, every layer's k/v scales. Raises
    :class:`ConfigError` when the scales are to be computed from the first batch (blocks
    saved before would not match the ones after)."""
    config = ctx.engine_config
    if config.calculate_kv_scales:
        raise ConfigError("a KV connector needs fixed KV-cache scales, but "
                          "calculate_kv_scales computes them from the first batch; load "
                          "them from the checkpoint instead")
    layers = [module for module in model.modules() if isinstance(module, Attention)]
    scales = tuple(float(value) for layer in layers for name in ("k_scale", "v_scale")
                   if hasattr(layer, name) for value in getattr(layer, name).tolist())
    return KVLayout(backend=config.attention_backend,
                    layout=ctx.attention_backend.kv_cache_layout,
                    kv_cache_dtype=config.kv_cache_dtype, block_size=config.block_size,
                    num_kv_heads=config.num_kv_heads, head_size=config.head_size,
                    num_layers=len(layers), scales=scales)


def build_connector(connector: str | type[Connector], layout: KVLayout, policy: str | None,
                    options: dict[str, Any]) -> Connector:
    """The connector named in the registry (or given as a class), built for ``layout``
    with ``options``; a bad option is a :class:`ConfigError` naming the connector."""
    cls = registries.connectors.get(connector) if isinstance(connector, str) else connector
    if not (isinstance(cls, type) and issubclass(cls, Connector)):
        raise ConfigError(f"kv_connector must name a registered connector or be a Connector "
                          f"subclass, got {connector!r}")
    try:
        return cls(layout, policy, **options)
    except TypeError as exc:
        raise ConfigError(f"kv_connector_config does not fit connector "
                          f"{cls.get_name()}: {exc}") from exc


def layer_name(index: int) -> str:
    """The name connectors know layer ``index``'s cache by."""
    return f"layers.{index}"


def request_key(seq: Sequence) -> str:
    """The request id a connector sees for ``seq`` (completion ``i > 0`` of a request with
    ``n`` samples gets ``"#i"`` appended)."""
    return f"{seq.request_id}#{seq.index}" if seq.index else seq.request_id


class KVTransfer:
    """Drives ``connector`` for an engine's block manager and model."""

    def __init__(self, connector: Connector, block_manager: BlockManager, model: Any,
                 kv_caches: list[Any]) -> None:
        self.connector = connector
        self.block_manager = block_manager
        self.kv_caches = {layer_name(i): cache for i, cache in enumerate(kv_caches)}
        self._metadata: ConnectorMetadata | None = None
        self._loads: list[tuple[Sequence, list[BlockTransfer]]] = []
        self._load_error: BaseException | None = None
        self._errors: dict[str, KVTransferError] = {}
        #: Blocks loaded from the connector, and blocks whose load failed, so far.
        self.num_loaded_blocks = self.num_failed_blocks = 0
        layers = [module for module in model.modules() if isinstance(module, Attention)]
        if len(layers) != len(kv_caches):
            raise KVTransferError(f"the model has {len(layers)} attention layers but "
                                  f"{len(kv_caches)} KV caches; connectors need one each")
        for index, layer in enumerate(layers):
            name = layer_name(index)
            layer.register_forward_pre_hook(lambda *_, name=name: self._before_layer(name))

    # --- scheduler side -----------------------------------------------------------------

    def external_tokens(self, seq: Sequence, num_computed_tokens: int) -> int:
        """Tokens after ``num_computed_tokens`` the connector can load for ``seq``."""
        if seq.prompt_logprobs is not None:
            return 0
        size = self.block_manager.block_size
        self.block_manager.hash_blocks(seq)
        usable = (seq.num_tokens - 1) // size * size - num_computed_tokens
        if usable <= 0:
            return 0
        request = ConnectorRequest(request_key(seq), seq.num_tokens, tuple(seq.block_hashes))
        try:
            found = self.connector.get_num_new_matched_tokens(request, num_computed_tokens)
        except Exception:  # a store that cannot be asked supplies nothing
            logger.warning("connector %s failed to look up request %s; computing it",
                           self.connector.get_name(), request.request_id, exc_info=True)
            return 0
        return max(0, min(found - found % size, usable))

    def add_load(self, seq: Sequence, first_block: int) -> None:
        """Load ``seq``'s blocks from ``first_block`` up to its computed tokens this step."""
        last = seq.num_computed_tokens // self.block_manager.block_size
        self._loads.append((seq, [BlockTransfer(seq.block_hashes[i], seq.block_table[i])
                                  for i in range(first_block, last)]))

    # --- one step ---------------------------------------------------------------------------

    def begin_step(self, batch: ScheduledBatch) -> None:
        """Start the step's loads; note the blocks it will fill, to save."""
        size = self.block_manager.block_size
        metadata = ConnectorMetadata(self.connector.fingerprint)
        for seq, transfers in self._loads:
            metadata.loads[request_key(seq)] = transfers
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens, strict=True):
            first, end = (seq.num_computed_tokens // size,
                          (seq.num_computed_tokens + num_new) // size)
            if end > first:
                self.block_manager.hash_blocks(seq)
                metadata.saves[request_key(seq)] = [
                    BlockTransfer(seq.block_hashes[i], seq.block_table[i])
                    for i in range(first, end)]
        self._metadata, self._load_error = metadata, None
        if metadata.loads:
            try:
                self.connector.start_load_kv(metadata, self.kv_caches)
            except Exception as exc:
                self._load_error = exc

    @property
    def loading(self) -> bool:
        """Whether the step begun loads blocks: it must run eagerly, so that each layer
        waits for its loads (no step graph replay)."""
        return self._metadata is not None and bool(self._metadata.loads)

    def _before_layer(self, name: str) -> None:
        metadata = self._metadata
        if metadata is not None and metadata.loads and self._load_error is None:
            try:
                self.connector.wait_for_layer_load(name)
            except Exception as exc:  # the step goes on; its loads count as failed
                self._load_error = exc

    def end_step(self, completed: bool = True) -> dict[Sequence, int]:
        """Finish the step: settle its loads, then save the blocks it filled (all of them,
        but those of sequences whose loads failed; none when the step did not complete).
        Returns, for each sequence whose loads failed, how many of its leading tokens are
        valid. Under the ``fail`` policy the error of each is kept for
        :meth:`pop_errors`."""
        metadata, loads = self._metadata, self._loads
        self._metadata, self._loads = None, []
        rewind = self._settle_loads(loads) if loads else {}
        if metadata is not None and completed:
            self._save(metadata, {request_key(seq) for seq in rewind})
        return rewind

    def _save(self, metadata: ConnectorMetadata, void: set[str]) -> None:
        """Save ``metadata.saves`` but the requests in ``void``, layer by layer."""
        saves = {key: transfers for key, transfers in metadata.saves.items()
                 if key not in void}
        if not saves:
            return
        metadata = ConnectorMetadata(metadata.layout_fingerprint, saves=saves)
        try:
            for name, cache in self.kv_caches.items():
                self.connector.save_kv_layer(name, cache, metadata)
            self.connector.wait_for_save()
        except Exception:
            logger.warning("connector %s failed to save blocks", self.connector.get_name(),
                           exc_info=True)

    def _settle_loads(self, loads: list[tuple[Sequence, list[BlockTransfer]]]
                      ) -> dict[Sequence, int]:
        failed = self._failed_blocks(loads)
        outcomes = [t.block_id in failed for _, transfers in loads for t in transfers]
        self.num_failed_blocks += sum(outcomes)
        self.num_loaded_blocks += len(outcomes) - sum(outcomes)
        rewind = {}
        size = self.block_manager.block_size
        for seq, transfers in loads:
            bad = [i for i, transfer in enumerate(transfers) if transfer.block_id in failed]
            if not bad:
                continue
            first = seq.block_table.index(transfers[bad[0]].block_id)
            rewind[seq] = first * size
            reason = (f"{len(bad)} of the {len(transfers)} KV blocks of request "
                      f"{request_key(seq)} could not be loaded by connector "
                      f"{self.connector.get_name()}")
            if self._load_error is not None:
                reason += f": {self._load_error}"
            logger.warning("%s; %s", reason, self.connector.policy.value)
            if self.connector.policy.value == "fail":
                self._errors[seq.request_id] = KVTransferError(reason)
        return rewind

    def _failed_blocks(self, loads: list[tuple[Sequence, list[BlockTransfer]]]) -> set[int]:
        if self._load_error is not None:
            return {t.block_id for _, transfers in loads for t in transfers}
        try:
            return set(self.connector.get_block_ids_with_load_errors())
        except Exception as exc:
            self._load_error = exc
            return {t.block_id for _, transfers in loads for t in transfers}

    def pop_errors(self) -> dict[str, KVTransferError]:
        """The requests that failed under the ``fail`` policy since the last call (by
        request id), with their errors."""
        errors, self._errors = self._errors, {}
        return errors

    def request_finished(self, request_id: str) -> None:
        try:
            self.connector.request_finished(request_id)
        except Exception:
            logger.warning("connector %s failed to release request %s",
                           self.connector.get_name(), request_id, exc_info=True)
