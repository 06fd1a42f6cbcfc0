"""``Connector``: moves KV-cache blocks between an engine and an outside store or engine.

Blocks are addressed two ways. In a store, a full block is named by its chained hash
(hex sha256 of the parent block's hash, the block's token ids and its extra keys; the
first block's parent is the model's root hash), so equal prefixes of different requests,
engines or processes name the same blocks. In an engine, it is a block id of layer
``name``'s cache ``kv_caches[name]``, whose layout (the backend's registered
:class:`~hwplug.kv_cache_layout.KVCacheLayout`, :attr:`Connector.cache_layout`) says where
the block lies: a connector reads and writes blocks only through it (``select_blocks``,
``write_blocks``, ``join_blocks``), and one block is a one-block cache of that layout.
:class:`BlockTransfer` pairs the two.

Each step the engine asks, for a request that starts, how many tokens past its local
prefix the connector can supply (:meth:`Connector.get_num_new_matched_tokens`), then
hands over one :class:`ConnectorMetadata`: the blocks to load into the cache (before the
layers that read them: :meth:`~Connector.start_load_kv`, then
:meth:`~Connector.wait_for_layer_load` per layer) and the blocks this step fills, to save
(:meth:`~Connector.save_kv_layer` per layer right after the layer wrote them, then
:meth:`~Connector.wait_for_save`). Blocks that could not be loaded are reported by
:meth:`~Connector.get_block_ids_with_load_errors`, and the engine applies the
``kv_load_failure_policy``.

Both sides of a transfer compare :func:`kv_layout_fingerprint` before moving bytes:
everything that changes a block's bytes (backend, layout, dtype, block size, geometry,
fp8 scales) is in it. :func:`layout_converter` allows a pair of layouts that differ only
in their ``backend``/``layout`` fields: blocks convert through the reference layout
(the source layout's ``to_reference``, then the target's ``from_reference``), or through
a converter registered for the pair (:func:`register_layout_converter`), which takes
precedence; any other difference raises :class:`KVLayoutMismatchError` naming the fields.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug import registries
from hwplug.errors import ConfigError, HwplugError
from hwplug.interface import StrictInterface
from hwplug.kv_cache_layout import KVCacheLayout, checked_reference, registered_layout
from hwplug.registry import Registry

if TYPE_CHECKING:
    from pathlib import Path

    import torch

__all__ = ["BlockTransfer", "Connector", "ConnectorMetadata", "ConnectorRequest", "KVLayout",
           "KVLayoutMismatchError", "KVLoadFailurePolicy", "KVTransferError", "LAYOUT_FIELDS",
           "ThroughReference", "compatibility_key", "kv_layout_fingerprint",
           "layout_converter", "register_layout_converter"]

logger = logging.getLogger(__name__)
#: Connector classes already reported as loading nothing (see get_num_new_matched_tokens).
_SAVE_ONLY: set[type] = set()


class KVLoadFailurePolicy(str, Enum):
    """What happens when loading external KV blocks fails."""

    FAIL = "fail"          #: the request fails with the error
    RECOMPUTE = "recompute"  #: the blocks are recomputed by prefill instead


class KVTransferError(HwplugError, RuntimeError):
    """KV blocks could not be saved, found or loaded (the message says which and why)."""


class KVLayoutMismatchError(KVTransferError, ValueError):
    """Two sides of a transfer hold blocks of different bytes; ``fields`` names the
    :class:`KVLayout` fields that differ."""

    def __init__(self, message: str, fields: list[str]) -> None:
        super().__init__(message)
        self.fields = fields


@dataclass(frozen=True)
class KVLayout:
    """Everything that fixes the bytes of one KV block.

    ``scales`` holds an fp8 cache's k/v scales, flattened layer by layer (empty for
    caches that need none): blocks written with other scales decode to other values.
    """

    backend: str
    layout: str
    kv_cache_dtype: str
    block_size: int
    num_kv_heads: int
    head_size: int
    num_layers: int
    scales: tuple[float, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KVLayout:
        """The layout :meth:`to_json` wrote; raises :class:`KVTransferError` otherwise."""
        try:
            data = json.loads(text)
            data["scales"] = tuple(data.get("scales", ()))
            return cls(**data)
        except (TypeError, ValueError, KeyError) as exc:
            raise KVTransferError(f"not a KV layout description: {text[:80]!r} ({exc})") from exc


def kv_layout_fingerprint(layout: KVLayout) -> str:
    """A short stable hash of ``layout``; equal fingerprints mean interchangeable blocks."""
    return hashlib.sha256(layout.to_json().encode()).hexdigest()[:16]


#: The fields a layout conversion may bridge; any other difference is an error.
LAYOUT_FIELDS = ("backend", "layout")
#: ``(blocks, source, target) -> blocks``: one layer's blocks (a cache of those blocks, as
#: ``select_blocks`` gives them) in the source layout, returned in the target's.
LayoutConverter = Callable[["torch.Tensor", KVLayout, KVLayout], "torch.Tensor"]
layout_converters: Registry[Any] = Registry("KV layout converter", registries.DISCOVERY)


def register_layout_converter(source: str, target: str, converter: LayoutConverter | str,
                              *, override: bool = False) -> None:
    """Register a direct converter of blocks of layout ``source`` into ``target``'s (e.g. one
    faster than going through ``NHD``); it takes precedence over the conversion
    :func:`layout_converter` derives from the two layout objects. ``converter`` may be a
    lazy ``"module:function"``."""
    layout_converters.register(f"{source}->{target}", converter, override=override)


def _identity(blocks: torch.Tensor, source: KVLayout, target: KVLayout) -> torch.Tensor:
    return blocks


@dataclass(frozen=True)
class ThroughReference:
    """The converter derived from two registered layouts: ``source``'s ``to_reference``
    (after its ``check``), then ``target``'s ``from_reference`` into a new tensor of
    ``target``'s shape for the same blocks. Exact: the bytes of every entry are kept."""

    source: KVCacheLayout
    target: KVCacheLayout

    def __call__(self, blocks: torch.Tensor, source: KVLayout, target: KVLayout
                 ) -> torch.Tensor:
        reference = checked_reference(self.source, blocks)
        _, num_blocks, block_size, num_kv_heads, head_size = reference.shape
        out = reference.new_empty(self.target.shape(num_blocks, block_size, num_kv_heads,
                                                    head_size, reference.dtype))
        self.target.from_reference(reference, out)
        return out


def layout_converter(source: KVLayout, target: KVLayout) -> LayoutConverter:
    """How blocks written under ``source`` are read under ``target``: unchanged when only
    the backend names differ (same layout, same bytes); when the layouts differ, through
    a converter registered for the pair, else :class:`ThroughReference` of the two
    registered layout objects. Raises :class:`KVLayoutMismatchError` naming the fields
    when anything else differs, or when a layout is neither registered nor bridged by a
    registered converter."""
    differing = [f.name for f in fields(KVLayout)
                 if getattr(source, f.name) != getattr(target, f.name)]
    other = [name for name in differing if name not in LAYOUT_FIELDS]
    if other:
        detail = ", ".join(f"{name} {getattr(source, name)!r} vs {getattr(target, name)!r}"
                           for name in other)
        raise KVLayoutMismatchError(f"KV blocks are not interchangeable: {detail}", other)
    if source.layout == target.layout:
        return _identity
    key = f"{source.layout}->{target.layout}"
    names = (source.layout, target.layout)
    if key in layout_converters:
        return layout_converters.get(key)
    missing = [name for name in names if name not in registries.kv_layouts]
    if missing:
        raise KVLayoutMismatchError(
            f"KV layout {source.layout} ({source.backend}) differs from {target.layout} "
            f"({target.backend}), and {' and '.join(missing)} is no registered KV-cache "
            f"layout (registered: {', '.join(registries.kv_layouts.names())}) nor is a "
            f"converter registered for {key}", ["layout"])
    return ThroughReference(*(registries.kv_layouts.get(name) for name in names))


def compatibility_key(layout: KVLayout) -> str:
    """The fingerprint of ``layout`` without its backend and layout names: stores keyed by
    it are shared by engines whose blocks convert into each other."""
    return kv_layout_fingerprint(replace(layout, backend="", layout=""))


@dataclass(frozen=True)
class BlockTransfer:
    """One block to move: its chained hash (the store's name) and its id in the cache."""

    block_hash: str
    block_id: int


@dataclass(frozen=True)
class ConnectorRequest:
    """What a connector sees of a request: its id, its token count and the chained hashes
    of its full blocks, in order."""

    request_id: str
    num_tokens: int
    block_hashes: tuple[str, ...]


@dataclass
class ConnectorMetadata:
    """Per-step instructions from the scheduler: request id -> the blocks to move."""

    layout_fingerprint: str
    loads: dict[str, list[BlockTransfer]] = field(default_factory=dict)
    saves: dict[str, list[BlockTransfer]] = field(default_factory=dict)


class Connector(StrictInterface, abc.ABC):
    """Saves and loads KV blocks layer by layer, asynchronously where the store allows.

    Built as ``cls(layout, policy, **options)`` (``options`` from the engine's
    ``kv_connector_config``). Runs on the engine's thread; it may use threads of its own.
    :attr:`cache_layout` is the registered layout object named by ``layout.layout``: read
    and write the engine's blocks through it, never by indexing a dimension.
    """

    _interface_root = True

    #: ``"fail"`` (default) or ``"recompute"``.
    kv_load_failure_policy: ClassVar[str] = KVLoadFailurePolicy.FAIL.value

    def __init__(self, layout: KVLayout, policy: str | None = None) -> None:
        chosen = policy or self.kv_load_failure_policy
        valid = [p.value for p in KVLoadFailurePolicy]
        if chosen not in valid:
            raise ConfigError(f"kv_load_failure_policy {chosen!r} is not valid; choose one of: "
                              f"{', '.join(valid)}")
        self.layout = layout
        #: The engine's KV-cache layout: where its blocks lie in each layer's cache.
        self.cache_layout: KVCacheLayout = registered_layout(layout.layout)
        self.fingerprint = kv_layout_fingerprint(layout)
        self.policy = KVLoadFailurePolicy(chosen)

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The connector's registered name."""

    def get_num_new_matched_tokens(self, request: ConnectorRequest,
                                   num_computed_tokens: int) -> int:
        """How many tokens after the first ``num_computed_tokens`` (a whole number of
        blocks the engine already holds) the connector can load: ``block_size`` times the
        number of consecutive blocks of ``request.block_hashes`` it has from there.

        Every connector that loads overrides this. The default, 0 (nothing to load: the
        engine computes every token), keeps connectors written before the method existed
        working as save-only connectors; it logs that once per class."""
        if type(self) not in _SAVE_ONLY:
            _SAVE_ONLY.add(type(self))
            logger.warning("connector %s does not implement get_num_new_matched_tokens "
                           "(added after release 0.1): it loads nothing", self.get_name())
        return 0

    @abc.abstractmethod
    def start_load_kv(self, metadata: ConnectorMetadata, kv_caches: dict[str, Any]) -> None:
        """Begin loading ``metadata.loads`` into the per-layer caches (may return early)."""

    @abc.abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until ``layer_name``'s blocks are in its cache (or failed: see
        :meth:`get_block_ids_with_load_errors`)."""

    @abc.abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      metadata: ConnectorMetadata) -> None:
        """Begin saving ``metadata.saves`` blocks of one layer's cache (copy what must
        outlive the call, e.g. with ``cache_layout.select_blocks``: the engine reuses the
        cache)."""

    @abc.abstractmethod
    def wait_for_save(self) -> None:
        """Block until every save started this step is durable."""

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Block ids of the last :meth:`start_load_kv` that were not loaded (all layers
        waited for). The engine recomputes or fails their requests by the policy."""
        return set()

    def request_finished(self, request_id: str) -> None:
        """The request ended (finished, aborted or failed); release what it holds."""

    def close(self) -> None:
        """Release the connector's threads, files and connections (idempotent)."""

    @classmethod
    def conformance_config(cls, workdir: Path) -> dict[str, Any] | None:
        """The options the conformance kit builds the connector with (it may use the empty
        directory ``workdir``), or None when it cannot be checked alone (e.g. it needs a
        peer engine). Default: no options."""
        return {}
