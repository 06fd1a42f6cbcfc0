"""``Connector``: moves KV-cache blocks between an engine and an outside store or engine.

Both sides of a transfer compare :func:`kv_layout_fingerprint` before moving bytes:
everything that changes a block's bytes (backend, layout, dtype, block size, geometry,
scales) is in it, so a mismatch fails loudly instead of corrupting attention.
"""

from __future__ import annotations

import abc
import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.errors import ConfigError
from hwplug.interface import StrictInterface

if TYPE_CHECKING:
    import torch


class KVLoadFailurePolicy(str, Enum):
    """What happens when loading external KV blocks fails."""

    FAIL = "fail"          #: the request fails with the error
    RECOMPUTE = "recompute"  #: the blocks are recomputed by prefill instead


@dataclass(frozen=True)
class KVLayout:
    """Everything that fixes the bytes of one KV block."""

    backend: str
    layout: str
    kv_cache_dtype: str
    block_size: int
    num_kv_heads: int
    head_size: int
    num_layers: int
    scales: tuple[float, ...] = ()


def kv_layout_fingerprint(layout: KVLayout) -> str:
    """A short stable hash of ``layout``; equal fingerprints mean interchangeable blocks."""
    payload = json.dumps(asdict(layout), sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()[:16]


@dataclass
class ConnectorMetadata:
    """Per-step instructions from the scheduler: which blocks of which request to move."""

    layout_fingerprint: str
    loads: dict[str, list[int]] = field(default_factory=dict)  # request id -> block ids
    saves: dict[str, list[int]] = field(default_factory=dict)


class Connector(StrictInterface, abc.ABC):
    """Saves and loads KV blocks layer by layer, asynchronously where the store allows."""

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
    def start_load_kv(self, metadata: ConnectorMetadata, kv_caches: dict[str, Any]) -> None:
        """Begin loading ``metadata.loads`` into the per-layer caches (may return early)."""

    @abc.abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        """Block until ``layer_name``'s blocks are loaded; raise on failure."""

    @abc.abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      metadata: ConnectorMetadata) -> None:
        """Begin saving ``metadata.saves`` blocks of one layer's cache."""

    @abc.abstractmethod
    def wait_for_save(self) -> None:
        """Block until every save started this step is durable."""
