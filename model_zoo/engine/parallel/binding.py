"""Binding the thread that runs torch to the CPUs ``HWPLUG_CPU_BIND`` gives its rank.

:func:`binding_plan` turns ``HWPLUG_CPU_BIND`` into one CPU set per rank over the NUMA
topology the probe reads (``HWPLUG_PROBE_ROOT``, :mod:`hwplug.platforms.numa`): ``none``
binds nothing; ``auto`` gives each rank a node (ranks split by blocks over the nodes: with
more ranks than nodes, a node's CPUs are shared out evenly among its ranks); an explicit
value lists each rank's CPUs, ranks separated by ``|`` (``0-7|8-15``). Only CPU
platforms bind: an accelerator's rank runs on its own device. A driver that spawns its
workers hands them its plan as an explicit list (:func:`plan_setting`), so a worker binds
to the CPUs the driver planned, whatever affinity it inherited.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from hwplug import envs
from hwplug.errors import ConfigError
from hwplug.platforms.numa import NumaNode, parse_cpulist, read_topology

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

Plan = list[tuple[int, ...]]


def plan_for(platform: Platform, world_size: int) -> Plan | None:
    """Each of ``world_size`` ranks' CPUs under ``HWPLUG_CPU_BIND`` (None: bind nothing,
    or not a CPU platform)."""
    if platform.device_type != "cpu":
        return None
    plan = binding_plan(envs.HWPLUG_CPU_BIND, read_topology(envs.HWPLUG_PROBE_ROOT),
                        world_size)
    if plan is not None:
        logger.info("CPU binding (HWPLUG_CPU_BIND=%s): %s", envs.HWPLUG_CPU_BIND,
                    "; ".join(describe_plan(plan)))
    return plan


def plan_setting(plan: Plan | None) -> str:
    """``plan`` as an ``HWPLUG_CPU_BIND`` value (``"0,1|2,3"``, or ``"none"``)."""
    if plan is None:
        return "none"
    return "|".join(",".join(map(str, cpus)) for cpus in plan)


def bind_thread(cpus: tuple[int, ...] | None) -> None:
    """Run the calling thread (and the threads it starts later, torch's OpenMP workers
    among them) on ``cpus`` with one torch thread per CPU; None leaves both as they are.
    Raises :class:`ConfigError` when none of ``cpus`` may be used by this process."""
    if cpus is None:
        return
    import torch

    try:
        os.sched_setaffinity(0, cpus)  # 0: the calling thread (Linux)
    except OSError as exc:
        raise ConfigError(f"cannot bind to CPUs {list(cpus)} ({exc.strerror}); this process "
                          f"may use {sorted(os.sched_getaffinity(0))}: check "
                          "HWPLUG_CPU_BIND") from None
    allowed = sorted(os.sched_getaffinity(0))  # cpus within this process's cpuset
    torch.set_num_threads(len(allowed))
    logger.info("thread bound to CPUs %s, %d torch threads", allowed, len(allowed))


def binding_plan(setting: str, nodes: list[NumaNode], world_size: int
                 ) -> list[tuple[int, ...]] | None:
    """The CPUs of each of ``world_size`` ranks under ``setting`` (None: bind nothing)."""
    if setting == "none":
        return None
    if setting != "auto":
        try:
            plan = [parse_cpulist(part) for part in setting.split("|")]
        except ValueError as exc:
            raise ConfigError(f"HWPLUG_CPU_BIND={setting!r}: {exc}") from None
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
