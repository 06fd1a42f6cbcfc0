"""GGUF runs repacked for their kernel (or joined), kept on disk: made once, mapped after.

The GGUF quant method repacks some runs of blocks once at load (the ``ggml_repack`` op,
see :mod:`hwplug.model_zoo.quant_methods.gguf`): at 1.5B parameters about 0.8 GB of
weights, read from the file and written again at every start. Inside :func:`caching`
(which :func:`~hwplug.model_zoo.context.build_model` opens around the weights' processing),
:func:`repacked` keeps what the repack op returns in a cache entry per source file, and a
later load maps it instead of repacking: no repack runs and the source's pages for those
runs are never touched, so the weights stay resident once (the cache file's pages).
Likewise :func:`joined_rows` keeps the runs the quant method copies into one (shards of
one type stored apart, e.g. a Qwen2.5-1.5B Q8_0's gate and up rows: 0.8 GB), where every
shard is a view of one mapped file, in an entry of its own (build :data:`JOIN_BUILD`).

An entry is ``HWPLUG_CACHE_DIR/``:data:`CACHE_KIND`\\ ``/<key>`` holding
:data:`PACKED_NAME` (the repacked runs back to back, each at a multiple of
:data:`ALIGNMENT` bytes: no larger than the repacked weights but for that padding) and
:data:`INDEX_NAME` (where each run is, keyed by its byte offset in the source, type and
shape). The key hashes :data:`LAYOUT_VERSION`, the repack's build (its variant and native
library file, whose name hashes the C source, compiler, flags and CPU), and the mapped
source file's resolved path, size and mtime_ns: a changed source, kernel or layout gives
a new entry. Whatever the repack op returns is cached as it is, whichever types it repacks.
Runs that are not views of a mapped file (e.g. a tensor-parallel rank's cut) and repacks
served by another variant than the op's first choice (a fallback) are not cached.

An entry is written whole at the end of a successful :func:`caching` block (staged in a
temporary directory and renamed into place, :func:`.cache.building`), only when a run was
missing from it; it replaces the source's other entries (:func:`discard_for`), so one
entry per source (and per kind: repacked or joined) stays on disk, and removes the entries
whose source is gone. A :data:`PACKED_NAME` of another size than its index says, or whose
runs' first bytes do not match the index's checksums, is discarded with a warning and
rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch

from hwplug import envs
from hwplug.errors import ModelError
from hwplug.model_zoo.loaders import cache
from hwplug.model_zoo.loaders.mapped import MappedFile, MappedTensor, locate

logger = logging.getLogger(__name__)

#: The cache kind (directory under ``HWPLUG_CACHE_DIR``) of the repacked runs.
CACHE_KIND = "gguf-repacked-k16"
#: Bump when what an entry holds or how it is laid out changes.
LAYOUT_VERSION = 1
PACKED_NAME, INDEX_NAME = "packed.bin", "index.json"
#: Each run starts at a multiple of this many bytes of :data:`PACKED_NAME`.
ALIGNMENT = 64
#: Bytes at the start of each run whose CRC-32 the index keeps (a cheap check on load).
CHECKED_BYTES = 4096

#: The build of the joined runs' entries: a copy of the rows, whichever kernel reads them.
JOIN_BUILD = "joined"

Repack = Callable[[torch.Tensor, int], torch.Tensor]

_SESSION: ContextVar[_Session | None] = ContextVar("hwplug_repacked_cache", default=None)


@contextmanager
def caching() -> Iterator[None]:
    """Within the block, :func:`repacked` reads and records repacked runs; when it ends
    without an error, every entry a run was missing from is written."""
    session = _Session()
    token = _SESSION.set(session)
    try:
        yield
    finally:
        _SESSION.reset(token)
    session.write()


def repacked(repack: Repack, rows: torch.Tensor, kind: int) -> torch.Tensor:
    """``repack(rows, kind)`` (GGUF rows of type ``kind``), read from the cache where a
    :func:`caching` block is open and its entry holds it: then a view of the entry's
    mapped :data:`PACKED_NAME`, and ``repack`` is not called."""
    session = _SESSION.get()
    return repack(rows, kind) if session is None else session.repacked(repack, rows, kind)


def joined_rows(parts: list[torch.Tensor], kind: int) -> torch.Tensor:
    """``torch.cat(parts)`` (GGUF rows of type ``kind``), read from the cache where a
    :func:`caching` block is open, every part is a view of one mapped file and its entry
    holds them: then a view of the entry's mapped :data:`PACKED_NAME`, and nothing is
    copied."""
    session = _SESSION.get()
    return torch.cat(parts) if session is None else session.joined(parts, kind)


def entry_dir(source: Path, build: str) -> Path:
    """The cache entry of the runs of mapped file ``source`` repacked by ``build``."""
    stat = source.stat()
    identity = "\n".join((str(LAYOUT_VERSION), build, str(source.resolve()),
                          str(stat.st_size), str(stat.st_mtime_ns)))
    key = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return envs.HWPLUG_CACHE_DIR.expanduser() / CACHE_KIND / key


def discard_for(source: Path, joins: bool | None = None) -> int:
    """Remove every entry of the runs of ``source`` (any build, any version of the file,
    as its index names it; ``joins``: only the joined runs' entries, or only the others),
    and every entry whose source file is gone (the ``repacked.bin`` of a conversion that a
    newer one replaced: nothing can map it again); the number removed. An entry being read
    keeps its mapping."""
    root = envs.HWPLUG_CACHE_DIR.expanduser() / CACHE_KIND
    wanted, removed = str(source.resolve()), 0
    for entry in root.glob("[!.]*") if root.is_dir() else ():
        try:
            index = json.loads((entry / INDEX_NAME).read_text())
            named, is_join = str(index["source"]), index.get("build") == JOIN_BUILD
        except (OSError, ValueError, AttributeError, KeyError, TypeError):
            continue
        if (named == wanted and joins in (None, is_join)) or not Path(named).exists():
            cache.discard(entry)
            removed += 1
    return removed


def build_identity(repack: Any) -> tuple[str, str] | None:
    """``(variant, identity)``: the variant a bound ``repack`` op chose, and what
    identifies its code (the variant and its native library file); None (nothing is
    cached) when it has no built native library or is not a bound op."""
    buckets = getattr(repack, "buckets", None)
    if not buckets:
        return None
    variant = buckets[0].chain[0]
    status = getattr(variant.native, "status", None)
    path = status().path if status is not None else None
    if path is None or not path.is_file():
        return None
    return variant.name, f"{variant.key}:{path.name}"


class _Session:
    """The entries one :func:`caching` block reads and fills, by source file and build."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, str], _Entry] = {}
        self.builds: dict[int, tuple[Any, tuple[str, str]]] = {}

    def repacked(self, repack: Repack, rows: torch.Tensor, kind: int) -> torch.Tensor:
        found = locate(rows) if rows.is_contiguous() else None
        if found is None:
            return repack(rows, kind)
        build = self._build(repack)
        entry = None if build is None else self._entry(found[0], build[1])
        key = f"{found[1]}:{kind}:{rows.shape[0]}x{rows.shape[1]}"
        packed = None if entry is None else entry.found.get(key)
        if packed is not None:
            return packed
        packed = repack(rows, kind)
        build = build or self._build(repack)  # its library may have been built just now
        if build is not None and repack.used() <= {build[0]} and packed.dtype == torch.uint8:  # type: ignore[attr-defined]
            self._entry(found[0], build[1]).new[key] = packed
        return packed

    def joined(self, parts: list[torch.Tensor], kind: int) -> torch.Tensor:
        found = [locate(part) if part.is_contiguous() else None for part in parts]
        if any(where is None for where in found) or len({id(where[0]) for where in found}) > 1:
            return torch.cat(parts)  # a part in memory, or parts of two files
        entry = self._entry(found[0][0], JOIN_BUILD)
        key = (f"{'+'.join(str(where[1]) for where in found)}:{kind}:"
               f"{sum(part.shape[0] for part in parts)}x{parts[0].shape[1]}")
        cached = entry.found.get(key)
        if cached is None:
            cached = entry.new[key] = torch.cat(parts)
        return cached

    def _entry(self, source: MappedFile, identity: str) -> _Entry:
        entry = self.entries.get((id(source), identity))
        if entry is None:
            entry = self.entries[(id(source), identity)] = _Entry(
                entry_dir(source.path, identity), source.path, identity == JOIN_BUILD)
        return entry

    def _build(self, repack: Repack) -> tuple[str, str] | None:
        """``repack``'s :func:`build_identity`, remembered once known."""
        known = self.builds.get(id(repack))
        if known is None or known[0] is not repack:
            build = build_identity(repack)
            if build is None:
                return None
            known = self.builds[id(repack)] = (repack, build)
        return known[1]

    def write(self) -> None:
        for entry in self.entries.values():
            entry.write()


class _Entry:
    """One cache entry: its runs mapped from disk (when it was readable) and those
    repacked in this session."""

    def __init__(self, path: Path, source: Path, joins: bool) -> None:
        self.path, self.source, self.joins = path, source, joins
        self.found: dict[str, torch.Tensor] = {}
        self.new: dict[str, torch.Tensor] = {}
        if path.is_dir():
            try:
                self.found = self._read()
            except ModelError as exc:
                logger.warning("the repacked-weights cache %s is unreadable, rebuilding "
                               "it: %s", path, exc)
                cache.discard(path)
                self.found = {}
        if self.found:
            logger.info("mapped %d repacked runs (%.1f MiB) from %s", len(self.found),
                        sum(t.numel() * t.element_size() for t in self.found.values())
                        / 2**20, path)

    def _read(self) -> dict[str, torch.Tensor]:
        """The entry's runs as views of its mapped :data:`PACKED_NAME`, each checked
        against the index (size, offsets, the CRC-32 of its first bytes);
        :class:`ModelError` when anything does not match."""
        try:
            index = json.loads((self.path / INDEX_NAME).read_text())
            if index["version"] != LAYOUT_VERSION:
                raise ModelError(f"layout version {index['version']}, not {LAYOUT_VERSION}")
            size, runs = int(index["size"]), index["runs"]
            tensors = {key: MappedTensor(int(offset), str(dtype), tuple(map(int, shape)))
                       for key, (offset, dtype, shape, _) in runs.items()}
            checks = {key: int(crc) for key, (*_, crc) in runs.items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"cannot read {INDEX_NAME}: {exc!r}") from exc
        packed = self.path / PACKED_NAME
        actual = packed.stat().st_size if packed.is_file() else None
        if actual != size:
            raise ModelError(f"{PACKED_NAME} is {actual} bytes, its index says {size}")
        mapped = MappedFile(packed, size, tensors)
        views = dict(mapped.views())
        for key, view in views.items():
            if _checksum(view) != checks[key]:
                raise ModelError(f"run {key} does not match its checksum")
            view.hwplug_mapped_file = mapped  # live (found by locate) while the run is held
        return views

    def write(self) -> None:
        """Write every run (found and new) as a new entry when any is new, replacing
        this source's other entries (an older file, build or layout)."""
        if not self.new:
            return
        runs = {**self.found, **self.new}
        discard_for(self.source, self.joins)  # their mappings live while views of them do
        index, offset = {}, 0
        with cache.building(self.path) as staging:
            with open(staging / PACKED_NAME, "wb") as file:
                for key, tensor in runs.items():
                    offset = -(-offset // ALIGNMENT) * ALIGNMENT
                    file.seek(offset)
                    file.write(memoryview(tensor.contiguous().reshape(-1).numpy()))
                    index[key] = [offset, "uint8", list(tensor.shape), _checksum(tensor)]
                    offset += tensor.numel()
            (staging / INDEX_NAME).write_text(json.dumps(
                {"version": LAYOUT_VERSION, "source": str(self.source.resolve()),
                 "build": JOIN_BUILD if self.joins else "repacked", "size": offset,
                 "runs": index}))
        logger.info("wrote %d repacked runs (%.1f MiB) to %s", len(runs), offset / 2**20,
                    self.path)


def _checksum(tensor: torch.Tensor) -> int:
    """CRC-32 of the first :data:`CHECKED_BYTES` bytes of uint8 ``tensor``."""
    data = tensor.contiguous().reshape(-1)[:CHECKED_BYTES].numpy()
    return zlib.crc32(memoryview(data))
