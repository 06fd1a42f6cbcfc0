"""Binding the thread that runs torch to the CPUs ``HWPLUG_CPU_BIND`` gives its rank.

The plan is :func:`hwplug.platforms.numa.binding_plan` over the NUMA topology the probe
reads (``HWPLUG_PROBE_ROOT``): ``auto`` gives each rank a node (or an even share of one),
``none`` binds nothing, and explicit lists (``0-7|8-15``) give each rank its own. Only CPU
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
from hwplug.platforms.numa import binding_plan, describe_plan, read_topology

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
