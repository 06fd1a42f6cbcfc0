"""NUMA topology from sysfs.

Reads, under ``root``, ``/sys/devices/system/node/node<N>/cpulist`` (``0-15,32-47``) and
``meminfo`` (``Node 0 MemTotal: ... kB``). Without that directory (macOS, some
containers) the host is one node holding every CPU :func:`os.sched_getaffinity` allows.

Works the same on x86 and Arm: it reads only the kernel's topology. Standard library only
(the plan that binds worker ranks to nodes is :mod:`hwplug.model_zoo.engine.parallel.binding`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hwplug.platforms._sysfs import numbered, read_text

_MEM_TOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its index, CPUs and memory (bytes, None when unknown)."""

    index: int
    cpus: tuple[int, ...]
    memory: int | None = None


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; :class:`ValueError` when garbled."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{text.strip()!r} is not a CPU list (e.g. 0-3,8,10-11)") from None
        if high < low or low < 0:
            raise ValueError(f"{part!r} in {text.strip()!r} is not a CPU range")
        cpus.extend(range(low, high + 1))
    return tuple(cpus)


def read_topology(root: Path = Path("/")) -> list[NumaNode]:
    """The host's NUMA nodes (never empty)."""
    nodes = []
    for path in numbered(root / "sys/devices/system/node", "node"):
        try:
            cpus = parse_cpulist(read_text(path / "cpulist") or "")
        except ValueError:
            continue
        match = _MEM_TOTAL.search(read_text(path / "meminfo") or "")
        if cpus:
            nodes.append(NumaNode(int(path.name.removeprefix("node")), cpus,
                                  int(match.group(1)) * 1024 if match else None))
    return nodes or [NumaNode(0, tuple(sorted(os.sched_getaffinity(0))))]
