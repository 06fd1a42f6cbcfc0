"""NUMA topology from sysfs, and the plan that binds CPU worker ranks to nodes.

Reads, under ``root``, ``/sys/devices/system/node/node<N>/cpulist`` (``0-15,32-47``) and
``meminfo`` (``Node 0 MemTotal: ... kB``). Without that directory (macOS, some
containers) the host is one node holding every CPU :func:`os.sched_getaffinity` allows.

:func:`binding_plan` turns ``HWPLUG_CPU_BIND`` into one CPU set per rank: ``none`` binds
nothing; ``auto`` gives each rank a node (ranks split by blocks over the nodes: with more
ranks than nodes, a node's CPUs are shared out evenly among its ranks); an explicit value
lists each rank's CPUs, ranks separated by ``|`` (``0-7|8-15``). Works the same on x86 and
Arm: it reads only the kernel's topology. Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hwplug.errors import ConfigError
from hwplug.platforms._sysfs import numbered, read_text

_MEM_TOTAL = re.compile(r"MemTotal:\s*(\d+)\s*kB")


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its index, CPUs and memory (bytes, None when unknown)."""

    index: int
    cpus: tuple[int, ...]
    memory: int | None = None


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; :class:`ConfigError` when garbled."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.strip().split(","))):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ConfigError(f"{text.strip()!r} is not a CPU list (e.g. 0-3,8,10-11)") from None
        if high < low or low < 0:
            raise ConfigError(f"{part!r} in {text.strip()!r} is not a CPU range")
        cpus.extend(range(low, high + 1))
    return tuple(cpus)


def read_topology(root: Path = Path("/")) -> list[NumaNode]:
    """The host's NUMA nodes (never empty)."""
    nodes = []
    for path in numbered(root / "sys/devices/system/node", "node"):
        try:
            cpus = parse_cpulist(read_text(path / "cpulist") or "")
        except ConfigError:
            continue
        match = _MEM_TOTAL.search(read_text(path / "meminfo") or "")
        if cpus:
            nodes.append(NumaNode(int(path.name.removeprefix("node")), cpus,
                                  int(match.group(1)) * 1024 if match else None))
    return nodes or [NumaNode(0, tuple(sorted(os.sched_getaffinity(0))))]


def binding_plan(setting: str, nodes: list[NumaNode], world_size: int
                 ) -> list[tuple[int, ...]] | None:
    """The CPUs of each of ``world_size`` ranks under ``setting`` (None: bind nothing)."""
    if setting == "none":
        return None
    if setting != "auto":
        plan = [parse_cpulist(part) for part in setting.split("|")]
        if len(plan) != world_size or not all(plan):
            raise ConfigError(f"HWPLUG_CPU_BIND={setting!r} lists {len(plan)} CPU sets; give "
                              f"one non-empty set per rank ({world_size}), separated by '|', "
                              "or auto, or none")
        return plan
    per_node = -(-world_size // len(nodes))
    plan = []
    for rank in range(world_size):
        node = nodes[min(rank // per_node, len(nodes) - 1)]
        sharing = [r for r in range(world_size)
                   if nodes[min(r // per_node, len(nodes) - 1)] is node]
        share = len(node.cpus) // len(sharing) or 1
        start = sharing.index(rank) * share
        plan.append(node.cpus[start:start + share] or node.cpus)
    return plan


def describe_plan(plan: list[tuple[int, ...]] | None) -> list[str]:
    """``["rank 0: cpus 0-7", ...]`` (``["no binding"]`` for None)."""
    if plan is None:
        return ["no binding"]
    return [f"rank {rank}: cpus {_ranges(cpus)}" for rank, cpus in enumerate(plan)]


def _ranges(cpus: tuple[int, ...]) -> str:
    runs: list[list[int]] = []
    for cpu in cpus:
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
