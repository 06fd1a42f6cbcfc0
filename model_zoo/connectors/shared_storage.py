"""``shared_storage``: KV blocks as safetensors files under a directory any engine can read.

Block ``h`` is ``<path>/<compatibility key>/<h[:2]>/<h>.safetensors`` with one tensor per
layer (``layers.0`` ...). The compatibility key is the layout fingerprint without the
backend and layout names, so engines whose blocks convert into each other share files and
others never see them. Each layer's tensor is the block as a one-block cache of the
writer's layout. Each file's metadata holds the block's identity: its chained hash (which
names the model too: the chain starts at the model's root hash), the full
:class:`KVLayout` that wrote it (layout, dtype, geometry, fp8 scales) and a CRC-32 of every
tensor. A reader checks all three, converting through the reference layout (or a
converter registered for the pair) when only the layout differs, so a corrupt,
truncated, foreign, missing or misplaced file (another block's KV under this block's
name) is a failed block (the engine's ``kv_load_failure_policy`` decides what follows),
never wrong attention. Files are written to a temporary name in the same directory and renamed,
so a reader sees a whole block or none, and a second engine process started later reuses
the first one's prefills. Options (``kv_connector_config``): ``path`` (required),
``load_timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hwplug import checks
from hwplug.connector import KVLayout, compatibility_key
from hwplug.errors import ConfigError
from hwplug.model_zoo.connectors.layerwise import DEFAULT_LOAD_TIMEOUT_S, LayerwiseConnector

logger = logging.getLogger(__name__)

LAYOUT_KEY = "hwplug_kv_layout"
BLOCK_HASH_KEY = "hwplug_block_hash"
CHECKSUMS_KEY = "hwplug_crc32"


def checksum(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes."""
    return zlib.crc32(tensor.contiguous().view(torch.uint8).numpy())


class SharedStorageConnector(LayerwiseConnector):
    """KV blocks as files under ``path``."""

    def __init__(self, layout: KVLayout, policy: str | None = None, *,
                 path: str | os.PathLike[str] | None = None,
                 load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> None:
        if path is None:
            raise ConfigError("the shared_storage connector needs kv_connector_config "
                              "{'path': <directory>}")
        path = checks.path()("kv_connector_config path", path)
        super().__init__(layout, policy, load_timeout_s=load_timeout_s)
        self.directory = Path(path) / compatibility_key(layout)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"shared_storage cannot use {path}: {exc.strerror}") from exc
        self._reading: dict[str, tuple[Any, KVLayout, dict[str, int]] | None] = {}
        self._files = contextlib.ExitStack()

    @classmethod
    def get_name(cls) -> str:
        return "shared_storage"

    @classmethod
    def conformance_config(cls, workdir: Path) -> dict[str, Any] | None:
        return {"path": workdir}

    def _block_path(self, block_hash: str) -> Path:
        """Where block ``block_hash`` is stored."""
        return self.directory / block_hash[:2] / f"{block_hash}.safetensors"

    def _contains(self, block_hash: str) -> bool:
        return self._block_path(block_hash).is_file()

    def _start_reading(self, block_hashes: Sequence[str]) -> None:
        for block_hash in block_hashes:
            self._reading[block_hash] = self._open(block_hash)

    def _open(self, block_hash: str) -> tuple[Any, KVLayout, dict[str, int]] | None:
        try:
            handle = self._files.enter_context(
                safe_open(self._block_path(block_hash), framework="pt"))
            metadata = handle.metadata() or {}
            if metadata.get(BLOCK_HASH_KEY) != block_hash:
                raise ValueError(f"it holds the KV of block "
                                 f"{str(metadata.get(BLOCK_HASH_KEY))[:12]}, not "
                                 f"{block_hash[:12]}")
            return (handle, KVLayout.from_json(metadata[LAYOUT_KEY]),
                    json.loads(metadata[CHECKSUMS_KEY]))
        except Exception as exc:  # missing, truncated, not safetensors, no metadata, foreign
            logger.warning("cannot open %s: %s", self._block_path(block_hash), exc)
            return None

    def _read_layer(self, layer_name: str, block_hashes: Sequence[str]
                    ) -> list[torch.Tensor | None]:
        return [self._read(block_hash, layer_name) for block_hash in block_hashes]

    def _read(self, block_hash: str, layer_name: str) -> torch.Tensor | None:
        opened = self._reading.get(block_hash)
        if opened is None:
            return None
        handle, source, checksums = opened
        try:
            tensor = handle.get_tensor(layer_name)
            if checksum(tensor) != checksums[layer_name]:
                raise ValueError(f"{layer_name} fails its CRC-32 check")
            return self._converted(tensor, source)
        except Exception as exc:
            logger.warning("cannot read %s: %s", self._block_path(block_hash), exc)
            self._reading[block_hash] = None
            return None

    def _finish_reading(self) -> None:
        self._files.close()
        self._reading = {}

    def _write_blocks(self, blocks: dict[str, dict[str, torch.Tensor]]) -> None:
        layout = self.layout.to_json()
        for block_hash, layers in blocks.items():
            tensors = {name: tensor.contiguous() for name, tensor in layers.items()}
            metadata = {BLOCK_HASH_KEY: block_hash, LAYOUT_KEY: layout, CHECKSUMS_KEY: json.dumps(
                {name: checksum(tensor) for name, tensor in tensors.items()})}
            target = self._block_path(block_hash)
            target.parent.mkdir(exist_ok=True)
            temporary = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}")
            try:
                save_file(tensors, temporary, metadata=metadata)
                os.replace(temporary, target)
            finally:
                temporary.unlink(missing_ok=True)
