"""``Connector``: moves KV-cache blocks between an engine and an outside store or engine.

Blocks are addressed two ways. In a store, a full block is named by its chained hash
(hex sha256 of the parent block's hash, the block's token ids and its extra keys; the
first block's parent is the model's root hash), so equal prefixes of different requests,
engines or processes name the same blocks. In an engine, it is a block id: block ``b`` of
layer ``name``'s cache is ``kv_caches[name][:, b]`` (every layout hwplug knows keeps
blocks on dimension 1, after the K/V dimension). :class:`BlockTransfer` pairs the two.

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
in their ``backend``/``layout`` fields when a converter is registered for them
(:func:`register_layout_converter`); any other difference raises
:class:`KVLayoutMismatchError` naming the fields.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.errors import ConfigError, HwplugError
from hwplug.interface import StrictInterface
from hwplug.registry import Registry

if TYPE_CHECKING:
    from pathlib import Path

    import torch


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


#: The fields a registered converter may bridge; any other difference is an error.
LAYOUT_FIELDS = ("backend", "layout")
#: ``(blocks, source, target) -> blocks``: one layer's blocks ``cache[:, ids]`` in the
#: source layout, returned in the target's.
LayoutConverter = Callable[["torch.Tensor", KVLayout, KVLayout], "torch.Tensor"]
layout_converters: Registry[Any] = Registry("KV layout converter")


def register_layout_converter(source: str, target: str, converter: LayoutConverter | str,
                              *, override: bool = False) -> None:
    """Register how blocks of layout ``source`` (e.g. ``"NHD"``) become ``target``'s;
    ``converter`` may be a lazy ``"module:function"``."""
    layout_converters.register(f"{source}->{target}", converter, override=override)


def _identity(blocks: torch.Tensor, source: KVLayout, target: KVLayout) -> torch.Tensor:
    return blocks


def layout_converter(source: KVLayout, target: KVLayout) -> LayoutConverter:
    """How blocks written under ``source`` are read under ``target``: unchanged when only
    the backend names differ (same layout, same bytes), through the registered converter
    when the layouts differ. Raises :class:`KVLayoutMismatchError` naming the fields when
    anything else differs or no converter is registered."""
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
    if key not in layout_converters:
        from hwplug.discovery import current_platform

        current_platform()  # plugins register their converters when they load
    if key not in layout_converters:
        raise KVLayoutMismatchError(
            f"KV layout {source.layout} ({source.backend}) differs from {target.layout} "
            f"({target.backend}) and no converter is registered for {key}; registered: "
            f"{', '.join(layout_converters.names()) or 'none'}", ["layout"])
    return layout_converters.get(key)


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
        self.fingerprint = kv_layout_fingerprint(layout)
        self.policy = KVLoadFailurePolicy(chosen)

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The connector's registered name."""

    @abc.abstractmethod
    def get_num_new_matched_tokens(self, request: ConnectorRequest,
                                   num_computed_tokens: int) -> int:
        """How many tokens after the first ``num_computed_tokens`` (a whole number of
        blocks the engine already holds) the connector can load: ``block_size`` times the
        number of consecutive blocks of ``request.block_hashes`` it has from there."""

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
        outlive the call: the engine reuses the cache)."""

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
