"""How a built model holds its weights (``hwplug generate --verbose``): GGUF blocks used in
place from the mapped file or copied into memory, float tensors, and which tensors are held
dequantized and why.

:func:`weight_storage` walks the model's parameters and GGUF runs once each (a table two
layers share, e.g. a tied embedding, counts once; buffers such as rotary tables are not
weights) and groups them into :class:`WeightGroup` rows: GGUF blocks by type and by where
they live, other tensors by dtype and by why they are held so.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hwplug.kernel_registry.reference.ggml import type_name
from hwplug.model_zoo.loaders.mapped import MappedFile, locate
from hwplug.model_zoo.loaders.memory import format_bytes

#: Why a GGUF run is a copy in memory: shards of one layer that its file stores apart.
JOINED = "shards stored apart, joined once for one ggml_linear call"
REPACKED = "repacked once for ggml_linear_repacked (16-row groups)"


@dataclass(frozen=True)
class WeightGroup:
    """``count`` tensors of ``nbytes`` in all, held as ``held_as`` (``"GGUF Q4_K"``,
    ``"float32"``) in ``where`` (``"in place: mapped from x.gguf"`` or ``"memory"``), for
    ``why`` (``"as stored"``; ``"dequantized: ..."`` for floats made from quantized
    weights)."""

    held_as: str
    count: int
    nbytes: int
    where: str
    why: str

    @property
    def dequantized(self) -> bool:
        return self.why.startswith("dequantized")


def weight_storage(model: nn.Module, mapped: tuple[MappedFile, ...] = (),
                   dequantized: str | None = None) -> list[WeightGroup]:
    """The model's weights grouped by how they are held, largest first.

    ``mapped`` are the checkpoint's files used in place (views of them are reported as
    mapped from that file, with the reason the conversion copied them there where it
    did; GGUF runs repacked for their kernel as mapped from the repacked-weights cache
    where a load found them there; other tensors, e.g. a tensor-parallel rank's cut of
    GGUF rows, runs this load repacked or joined shards stored apart, as in memory);
    ``dequantized`` says why the checkpoint's quantized matrices were loaded as floats
    (e.g. ``"dequantize=True was asked"``), None when they were not.
    """
    ranges = [(*file.address_range(), file) for file in mapped]
    groups: dict[tuple[str, str, str], list[int]] = {}
    seen: set[int] = set()

    def add(held_as: str, tensor: torch.Tensor, where: str, why: str) -> None:
        group = groups.setdefault((held_as, where, why), [0, 0])
        group[0] += 1
        group[1] += tensor.numel() * tensor.element_size()

    def place(tensor: torch.Tensor) -> tuple[str, str]:
        """Where ``tensor`` lives and why there (for a quantized run)."""
        for start, end, file in ranges:
            if start <= tensor.data_ptr() < end:
                why = "; ".join(sorted(set(file.copied.values())))
                return f"in place: mapped from {file.path.name}", (
                    f"as stored; copied on conversion: {why}" if why else "as stored")
        return "memory", "as stored"

    def cached_place(rows: torch.Tensor, why: str) -> tuple[str, str]:
        """Where a run repacked for its kernel (or joined) lives: the repacked-weights
        cache's file an earlier load wrote (mapped), or memory (made by this load)."""
        cached = locate(rows)
        return ((f"in place: mapped from the repacked-weights cache ({cached[0].path.name})",
                 why) if cached else ("memory", why))

    for module in model.modules():
        repacked = getattr(module, "gguf_repacked", frozenset())
        joined = getattr(module, "gguf_joined", frozenset())
        for index, (kind, rows) in enumerate(getattr(module, "gguf_runs", ())):
            if rows.data_ptr() in seen:
                continue
            seen.add(rows.data_ptr())
            where, why = (cached_place(rows, REPACKED) if index in repacked else
                          cached_place(rows, JOINED) if index in joined else place(rows))
            add(f"GGUF {type_name(kind)}", rows, where, why)
        for tensor in module.parameters(recurse=False):
            if tensor.numel() == 0 or tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            matrix = tensor.dim() >= 2
            why = ("dequantized: " + dequantized if matrix and dequantized else
                   "as the checkpoint stores it" if matrix else
                   "a vector (norm, bias, scale)")
            add(str(tensor.dtype).removeprefix("torch."), tensor, "memory", why)
    rows = [WeightGroup(held_as, count, nbytes, where, why)
            for (held_as, where, why), (count, nbytes) in groups.items()]
    return sorted(rows, key=lambda row: -row.nbytes)


def summarize(groups: list[WeightGroup]) -> str:
    """One line: bytes mapped in place (from the checkpoint or the repacked-weights
    cache), bytes in memory, and what is held dequantized (``"dequantized: none"`` when
    nothing is)."""
    mapped = sum(g.nbytes for g in groups if g.where.startswith("in place"))
    memory = sum(g.nbytes for g in groups if not g.where.startswith("in place"))
    dequantized = [g for g in groups if g.dequantized]
    text = (f"{format_bytes(mapped)} in place in mapped files, "
            f"{format_bytes(memory)} in memory; dequantized: ")
    if not dequantized:
        return text + "none"
    reasons = sorted({g.why.removeprefix("dequantized: ") for g in dequantized})
    return text + (f"{sum(g.count for g in dequantized)} matrices "
                   f"({format_bytes(sum(g.nbytes for g in dequantized))}): "
                   f"{'; '.join(reasons)}")
