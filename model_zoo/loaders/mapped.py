"""Tensors used in place from a file mapped into memory: a GGUF's blocks, read without a copy.

A :class:`MappedFile` names a file, its size and the tensors it holds (byte offset, dtype,
shape). :meth:`MappedFile.views` maps the whole file once, copy-on-write
(``mmap.ACCESS_COPY``: a write to a view stays private to the process and never reaches
the file), and yields views of that one mapping. Nothing is read until a kernel touches
it; the pages are the page cache's (``RssFile``, not ``RssAnon``), shared with every other
process that maps the file, and the kernel drops them under memory pressure instead of
swapping them. All views of a file share one storage, so views of adjacent tensors can be
joined into one without a copy (see :mod:`hwplug.model_zoo.quant_methods.gguf`).

Where a consumer copies a view instead (the GGUF quant method repacking Q4_K / Q5_K /
Q6_K / IQ4_XS rows for its kernel), it calls :func:`release_pages` on the view afterwards, so the pages the
copy read are not kept resident beside the copy.
"""

from __future__ import annotations

import logging
import mmap
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from hwplug.errors import ModelError

logger = logging.getLogger(__name__)

#: The dtypes a mapped tensor may have, by name.
MAPPED_DTYPES = {"uint8": torch.uint8, "float32": torch.float32}
#: The mapped files whose mapping is made and that are still referenced, by ``id``.
_LIVE: weakref.WeakValueDictionary[int, MappedFile] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class MappedTensor:
    """A tensor stored in a file: ``shape`` values of ``dtype`` (a :data:`MAPPED_DTYPES`
    name) from byte ``offset``, C-contiguous."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * MAPPED_DTYPES[self.dtype].itemsize


@dataclass(frozen=True, eq=False)
class MappedFile:
    """The tensors ``tensors`` (name -> :class:`MappedTensor`) of the file ``path`` of
    ``size`` bytes, viewed in place by :meth:`views`; ``copied`` says, for tensors that
    are a conversion's copy of a source's (a GGUF's rows reordered), why: empty for the
    source file itself."""

    path: Path
    size: int
    tensors: Mapping[str, MappedTensor]
    copied: Mapping[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of the file its tensors cover."""
        return sum(tensor.nbytes for tensor in self.tensors.values())

    @cached_property
    def _mmap(self) -> mmap.mmap:
        """The copy-on-write mapping of the whole file (see :attr:`mapping`)."""
        try:
            with open(self.path, "rb") as file:
                size = file.seek(0, 2)
                if size != self.size:
                    raise ModelError(f"{self.path} is {size} bytes, but its tensors were "
                                     f"indexed in a file of {self.size} bytes: it changed")
                mapped = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
        except OSError as exc:
            raise ModelError(f"cannot map {self.path}: {exc}") from exc
        for name, tensor in self.tensors.items():
            itemsize = MAPPED_DTYPES[tensor.dtype].itemsize
            if tensor.offset % itemsize or not 0 <= tensor.offset <= size - tensor.nbytes:
                raise ModelError(f"{self.path}: tensor {name} ({tensor.nbytes} bytes at "
                                 f"{tensor.offset}) is outside the file or misaligned")
        logger.debug("mapped %s (%d bytes, %d tensors used in place)", self.path, size,
                     len(self.tensors))
        _LIVE[id(self)] = self
        return mapped

    @cached_property
    def mapping(self) -> torch.Tensor:
        """The whole file as one ``uint8`` tensor viewing a copy-on-write mapping, made on
        first use; the mapping lives while this object or any view does.

        Raises :class:`ModelError` when the file cannot be opened or is not ``size`` bytes
        any more (replaced since its tensors were indexed), or a tensor lies outside it or
        is not aligned to its dtype.
        """
        return torch.frombuffer(self._mmap, dtype=torch.uint8)  # holds the mmap object

    def address_range(self) -> tuple[int, int]:
        """``(first, last + 1)``: the addresses of the mapping (mapped now if not yet)."""
        start = self.mapping.data_ptr()
        return start, start + self.size

    def views(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, tensor)`` for every tensor: a view of the mapping, no copy."""
        whole = self.mapping
        for name, tensor in self.tensors.items():
            raw = whole[tensor.offset:tensor.offset + tensor.nbytes]
            yield name, raw.view(MAPPED_DTYPES[tensor.dtype]).view(tensor.shape)

    def release(self, tensor: torch.Tensor) -> int:
        """Drop from this process the pages of the mapping that lie wholly inside
        ``tensor``'s bytes (they are read from the file again if touched; nothing was
        written to them) and return how many bytes; 0 when ``tensor`` is not in it."""
        start, end = self.address_range()
        first = tensor.data_ptr()
        last = first + tensor.numel() * tensor.element_size()
        if not (start <= first and last <= end):
            return 0
        page = mmap.PAGESIZE
        low = -(-(first - start) // page) * page
        high = (last - start) // page * page
        if high <= low:
            return 0
        self._mmap.madvise(mmap.MADV_DONTNEED, low, high - low)
        return high - low


def release_pages(tensor: torch.Tensor) -> int:
    """:meth:`MappedFile.release` ``tensor``'s pages from the live mapping that holds it;
    0 (nothing done) when none does: ``tensor`` is then ordinary memory, freed when its
    last reference goes."""
    for mapped in list(_LIVE.values()):
        released = mapped.release(tensor)
        if released:
            return released
    return 0


def locate(tensor: torch.Tensor) -> tuple[MappedFile, int] | None:
    """``(file, byte offset)``: the live mapped file whose bytes ``tensor`` views and where
    its first byte is in it; None when it is no view of one."""
    first = tensor.data_ptr()
    last = first + tensor.numel() * tensor.element_size()
    for mapped in list(_LIVE.values()):
        start, end = mapped.address_range()
        if start <= first and last <= end:
            return mapped, first - start
    return None
