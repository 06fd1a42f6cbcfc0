"""``p2p``: disaggregated prefill and decode, two engines joined by torch.distributed.

The ``producer`` engine runs prefills (e.g. ``max_tokens=1``): every block it fills is
kept in host memory (a byte-capped LRU tier, as in ``cpu_offload``) and served to its peer
by a thread of its own. The ``consumer`` engine runs the decodes: for a request that
starts, it asks the producer how many of the request's blocks it holds, then pulls them,
layer by layer, into its own cache, and computes only the rest. The producer names the
blocks it sends (their chained hashes, which name the model too); blocks that are not
the ones asked for fail, and the connection is dropped. Blocks are named by their
chained hashes, so both engines must load the same model (the hashes would not match
otherwise) and nothing else needs to be shared.

Transport: point-to-point ``send``/``recv`` of CPU tensors in a ``gloo`` process group
(blocks are staged in host memory on both sides). The connector joins the default process
group when one exists (``torchrun``) and otherwise creates it from ``init_method``
(``env://`` by default: ``MASTER_ADDR``, ``MASTER_PORT``; pass ``rank`` and
``world_size``). Blocks travel as one cache of the producer's layout per layer (its layout
object's ``join_blocks``). Before any block moves, the two sides exchange their
:class:`KVLayout`: layouts that differ only in their layout names convert on the consumer,
through the reference layout (or a converter registered for the pair); any other
difference raises
:class:`~hwplug.connector.KVLayoutMismatchError` naming the fields, on both sides. A
transfer that breaks (the peer died) fails the blocks being loaded; the consumer then
supplies nothing more and the engine computes by itself (or fails the request, by the
policy). Options (``kv_connector_config``): ``role`` (required), ``peer_rank`` (default:
the other of two ranks), ``rank``, ``world_size``, ``init_method``, ``max_bytes``,
``timeout_s``, ``load_timeout_s``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hwplug import checks
from hwplug.connector import (
    ConnectorMetadata,
    ConnectorRequest,
    KVLayout,
    KVTransferError,
    layout_converter,
)
from hwplug.dtypes import torch_dtype
from hwplug.errors import ConfigError
from hwplug.model_zoo.connectors.cpu_offload import DEFAULT_MAX_BYTES
from hwplug.model_zoo.connectors.host_store import HostBlockStore
from hwplug.model_zoo.connectors.layerwise import DEFAULT_LOAD_TIMEOUT_S, LayerwiseConnector
from hwplug.model_zoo.connectors.p2p_group import join_group

logger = logging.getLogger(__name__)

ROLES = ("producer", "consumer")


class P2PConnector(LayerwiseConnector):
    """One side of a prefill (``producer``) / decode (``consumer``) pair."""

    def __init__(self, layout: KVLayout, policy: str | None = None, *, role: str | None = None,
                 peer_rank: int | None = None, rank: int | None = None,
                 world_size: int | None = None, init_method: str = "env://",
                 max_bytes: int = DEFAULT_MAX_BYTES, timeout_s: float = 60.0,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        if role not in ROLES:
            raise ConfigError(f"the p2p connector needs kv_connector_config role "
                              f"{' or '.join(ROLES)}, got {role!r}")
        if not checks.is_integer(max_bytes) or max_bytes < 1:
            raise ConfigError(f"p2p max_bytes must be a positive integer, got {max_bytes!r}")
        super().__init__(layout, policy, load_timeout_s=load_timeout_s)
        self.role = role
        group = join_group(rank, world_size, peer_rank, init_method, timeout_s)
        self._owns_group = group.owns_group
        self.peer = group.peer
        self.store = HostBlockStore(max_bytes)
        self._broken: str | None = None
        self._incoming: tuple[int, list[int], torch.dtype] | None = None
        try:
            self.peer_layout = self._handshake()
        except BaseException as exc:
            self._leave_group()
            if type(exc) is RuntimeError or isinstance(exc, dist.DistError):  # gloo's
                raise KVTransferError(f"p2p: the layout handshake with rank {self.peer} "
                                      f"failed: {exc}") from exc
            raise
        self._server: threading.Thread | None = None
        if role == "producer":
            self._server = threading.Thread(target=self._serve, name="hwplug-p2p-serve",
                                            daemon=True)
            self._server.start()

    @classmethod
    def get_name(cls) -> str:
        return "p2p"

    @classmethod
    def conformance_config(cls, workdir: Path) -> dict[str, Any] | None:
        return None  # needs a peer engine: tests/test_p2p.py runs the pair

    # --- wire ----------------------------------------------------------------------------

    def _send_tensor(self, tensor: torch.Tensor) -> None:
        dist.send(tensor.contiguous(), self.peer)

    def _recv_tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(tuple(shape), dtype=dtype)
        dist.recv(tensor, self.peer)
        return tensor

    def _send_json(self, message: Any) -> None:
        data = torch.frombuffer(bytearray(json.dumps(message).encode()), dtype=torch.uint8)
        self._send_tensor(torch.tensor([data.numel()], dtype=torch.int64))
        self._send_tensor(data)

    def _recv_json(self) -> Any:
        size = int(self._recv_tensor([1], torch.int64).item())
        return json.loads(bytes(self._recv_tensor([size], torch.uint8).numpy()))

    def _handshake(self) -> KVLayout:
        """Exchange layouts (producer first); raise on both sides if they cannot pair."""
        mine = json.loads(self.layout.to_json())
        if self.role == "producer":
            self._send_json(mine)
            theirs = self._recv_json()
        else:
            theirs = self._recv_json()
            self._send_json(mine)
        peer = KVLayout.from_json(json.dumps(theirs))
        source, target = (self.layout, peer) if self.role == "producer" else (peer, self.layout)
        layout_converter(source, target)  # KVLayoutMismatchError before any block moves
        return peer

    # --- producer ---------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            try:
                message = self._recv_json()
                if message["op"] == "close":
                    return
                found = self._leading(message["hashes"])
                if message["op"] == "query":
                    self._send_json({"count": len(found)})
                    continue
                if not found:
                    self._send_json({"count": 0})
                    continue
                layers = [self.cache_layout.join_blocks([block[f"layers.{index}"]
                                                         for block in found])
                          for index in range(self.layout.num_layers)]
                self._send_json({"count": len(found), "hashes": message["hashes"][:len(found)],
                                 "shape": list(layers[0].shape),
                                 "dtype": self.layout.kv_cache_dtype})
                for tensor in layers:
                    self._send_tensor(tensor)
            except Exception as exc:  # the peer is gone: nothing more to serve
                logger.warning("p2p producer: the connection to rank %d ended: %s",
                               self.peer, exc)
                return

    def _leading(self, hashes: Sequence[str]) -> list[dict[str, torch.Tensor]]:
        found = []
        for block_hash in hashes:
            block = self.store.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    # --- the store, for both roles ---------------------------------------------------------

    def _contains(self, block_hash: str) -> bool:
        return block_hash in self.store

    def _write_blocks(self, blocks: dict[str, dict[str, torch.Tensor]]) -> None:
        for block_hash, layers in blocks.items():
            self.store.put(block_hash, layers)

    # --- consumer ---------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: ConnectorRequest,
                                   num_computed_tokens: int) -> int:
        if self.role == "producer":
            return super().get_num_new_matched_tokens(request, num_computed_tokens)
        if self._broken:
            return 0
        hashes = request.block_hashes[num_computed_tokens // self.layout.block_size:]
        try:
            self._send_json({"op": "query", "hashes": list(hashes)})
            return int(self._recv_json()["count"]) * self.layout.block_size
        except Exception as exc:
            self._broken = str(exc)
            raise KVTransferError(f"p2p: asking rank {self.peer} failed: {exc}") from exc

    def _start_reading(self, block_hashes: Sequence[str]) -> None:
        self._incoming = None
        if self._broken:
            raise KVTransferError(f"p2p: the connection to rank {self.peer} is broken: "
                                  f"{self._broken}")
        try:
            self._send_json({"op": "fetch", "hashes": list(block_hashes)})
            header = self._recv_json()
        except Exception as exc:
            self._broken = str(exc)
            raise
        count = header["count"]
        if count and header.get("hashes") != list(block_hashes[:count]):
            # an answer to another request: the stream is out of step, nothing on it is ours
            self._broken = (f"rank {self.peer} sent {count} blocks that are not the ones "
                            f"asked for")
            raise KVTransferError(f"p2p: {self._broken}")
        if count:
            self._incoming = (count, header["shape"], torch_dtype(header["dtype"]))

    def _read_layer(self, layer_name: str, block_hashes: Sequence[str]
                    ) -> list[torch.Tensor | None]:
        missing: list[torch.Tensor | None] = [None] * len(block_hashes)
        if self._incoming is None:
            return missing
        count, shape, dtype = self._incoming
        try:
            blocks = self._converted(self._recv_tensor(shape, dtype), self.peer_layout)
        except Exception as exc:
            self._broken, self._incoming = str(exc), None
            raise KVTransferError(f"p2p: receiving {layer_name} from rank {self.peer} "
                                  f"failed: {exc}") from exc
        return [*(self.cache_layout.select_blocks(blocks, [j]) for j in range(count)),
                *missing[count:]]

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      metadata: ConnectorMetadata) -> None:
        if self.role == "producer":  # a consumer keeps what it decodes to itself
            super().save_kv_layer(layer_name, kv_layer, metadata)

    def close(self) -> None:
        if self.role == "consumer" and not self._broken:
            try:
                self._send_json({"op": "close"})
            except Exception:
                logger.debug("p2p: could not say goodbye to rank %d", self.peer, exc_info=True)
        if self._server is not None:
            self._server.join()
            self._server = None
        self._leave_group()

    def _leave_group(self) -> None:
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False
