"""Chained block hashes: the name of a full KV block.

Block ``i`` of a sequence is named ``sha256(parent || token ids || extra keys)`` (hex),
where ``parent`` is block ``i - 1``'s hash and, for the first block, the model's root
hash (``sha256`` of the model's identity, :func:`root_hash`). A name therefore stands for
the whole prefix up to the end of its block, on this model: prefix caching, KV events
and connectors all use it, and it is the same in every process that loads the model.
Extra keys are whatever else changes a block's K/V besides its tokens; today a
request's ``cache_salt``, on its first block only (as vLLM does), so that requests with
different salts never share cached blocks.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Bumped when the hashed bytes change, so old stores are not misread.
HASH_VERSION = b"hwplug-kv-block-v1"


def model_key(config: dict[str, Any], weight_files: Sequence[Path], dtype: str) -> str:
    """A stable identity of a loaded model: its config (without the transformers version
    that wrote it), its weight files' names and sizes, and the compute dtype (which
    changes the K/V a prefix produces). Equal in every process that loads the same files
    the same way."""
    config = {key: value for key, value in config.items() if key != "transformers_version"}
    files = [(path.name, path.stat().st_size) for path in weight_files]
    payload = json.dumps([config, files, dtype], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def root_hash(model_key: str) -> str:
    """The parent of every sequence's first block for the model named by ``model_key``."""
    return hashlib.sha256(HASH_VERSION + b"\0" + model_key.encode()).hexdigest()


def hash_block(parent: str, token_ids: Sequence[int], extra_keys: tuple[Any, ...] = ()) -> str:
    """The hex sha256 name of a full block of ``token_ids`` after ``parent``."""
    digest = hashlib.sha256(bytes.fromhex(parent))
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_keys:
        digest.update(json.dumps(list(extra_keys), separators=(",", ":")).encode())
    return digest.hexdigest()


def block_extra_keys(index: int, cache_salt: str | None) -> tuple[Any, ...]:
    """The extra keys of block ``index`` of a request salted with ``cache_salt``."""
    return (cache_salt,) if index == 0 and cache_salt is not None else ()


def extend_block_hashes(hashes: list[str], root: str, token_ids: Sequence[int],
                        block_size: int, cache_salt: str | None = None) -> None:
    """Append to ``hashes`` the names of the full blocks of ``token_ids`` not yet named."""
    for index in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else root
        tokens = token_ids[index * block_size:(index + 1) * block_size]
        hashes.append(hash_block(parent, tokens, block_extra_keys(index, cache_salt)))
