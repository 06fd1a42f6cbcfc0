"""The conversion cache: one directory per converted source file, written atomically.

An entry is ``HWPLUG_CACHE_DIR/<kind>/<key>``, where the key hashes
:data:`CACHE_FORMAT_VERSION`, the transformers version (it writes the converted config and
tokenizer) and the source's resolved path, size and mtime_ns: replacing or editing the source,
or upgrading transformers, gives a new entry. An entry is built in a temporary sibling
directory and renamed into place only once complete, so a process killed mid-build leaves no
entry, only a temporary directory that a later build of the same key removes after
:data:`STALE_STAGING_S`. An entry names its source in :data:`SOURCE_NAME`, and a new entry
replaces the kind's other entries of the same source (:func:`discard_others`): one entry per
source file and kind stays on disk, so an edited or replaced file, or a new hwplug or
transformers version, does not leave its older conversions behind. (Two installations that
share a cache directory but differ in those versions therefore convert a file again each in
turn.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

from hwplug import envs
from hwplug.errors import ConfigError

logger = logging.getLogger(__name__)

#: Bump when the layout or content of an entry changes; old entries are then ignored.
CACHE_FORMAT_VERSION = 5
#: A staging directory this much older than now belongs to a process that died.
STALE_STAGING_S = 3600.0
#: The file of an entry that names its source (the source's resolved path).
SOURCE_NAME = "source.txt"


def entry_dir(source: Path, kind: str) -> Path:
    """The cache entry for ``source`` (which must exist); it may not have been built yet."""
    stat = source.stat()
    identity = "\n".join((str(CACHE_FORMAT_VERSION), version("transformers"),
                          str(source.resolve()), str(stat.st_size), str(stat.st_mtime_ns)))
    key = hashlib.sha256(identity.encode()).hexdigest()[:32]
    return envs.HWPLUG_CACHE_DIR.expanduser() / kind / key


@contextmanager
def building(entry: Path, source: Path | None = None) -> Iterator[Path]:
    """Yield an empty staging directory to write ``entry`` into.

    When the block ends normally the staging directory is renamed to ``entry``; if another
    process built the entry meanwhile, theirs is kept. With ``source``, the entry names it
    (:data:`SOURCE_NAME`) and, once in place, replaces the other entries of ``source``
    (:func:`discard_others`). When the block raises, the staging directory is removed and
    nothing is left behind. Raises :class:`ConfigError` when the cache directory is not
    writable.
    """
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(entry)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".tmp",
                                        dir=entry.parent))
    except OSError as exc:
        raise ConfigError(f"cannot write the model cache in {entry.parent} ({exc}); set "
                          f"HWPLUG_CACHE_DIR to a writable directory") from exc
    try:
        yield staging
        if source is not None:
            (staging / SOURCE_NAME).write_text(str(source.resolve()))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        os.rename(staging, entry)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not entry.is_dir():
            raise
        logger.info("another process built the cache entry %s first; using it", entry)
    if source is not None:
        discard_others(entry, source)


def discard_others(entry: Path, source: Path) -> int:
    """Remove the entries beside ``entry`` (of its kind) that name ``source`` as theirs;
    the number removed. A process that maps an entry's files keeps its mappings."""
    wanted, removed = str(source.resolve()), 0
    for other in entry.parent.glob("[!.]*"):
        try:
            named = (other / SOURCE_NAME).read_text()
        except OSError:  # no such file: an entry that does not name its source
            continue
        if other != entry and named == wanted:
            discard(other)
            removed += 1
    if removed:
        logger.info("removed %d older cache entries of %s", removed, source)
    return removed


def discard(entry: Path) -> None:
    """Remove ``entry``: renamed aside first, so no reader sees it half-deleted."""
    doomed = entry.with_name(f".{entry.name}.{uuid.uuid4().hex}.tmp")
    try:
        os.rename(entry, doomed)
    except FileNotFoundError:  # another process removed it first
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_stale_staging(entry: Path) -> None:
    cutoff = time.time() - STALE_STAGING_S
    for staging in entry.parent.glob(f".{entry.name}.*.tmp"):
        try:
            stale = staging.stat().st_mtime < cutoff
        except FileNotFoundError:
            continue
        if stale:
            logger.info("removing %s, left by an interrupted conversion", staging)
            shutil.rmtree(staging, ignore_errors=True)
