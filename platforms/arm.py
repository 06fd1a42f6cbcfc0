"""Probe for Arm CPUs (served by the ``cpu-arm`` platform of hwplug-cpu-arm).

The host is Arm when ``machine`` (default: ``/proc/sys/kernel/arch`` under ``root``, else
:func:`platform.machine`) is ``aarch64`` or ``arm64``. ``/proc/cpuinfo`` under ``root``, where readable, then
names the cores: each ``processor`` block's ``CPU implementer`` and ``CPU part`` are
looked up in small tables of well-known cores, and its ``Features`` line gives the
vector and matrix extensions hwplug cares about (:data:`FEATURES`).

Features are named as Arm's extensions are named by compilers (``-march=...+dotprod``),
ACLE and KleidiAI's kernels, not by the kernel's HWCAP words: cpuinfo's ``asimd`` is
``neon`` and ``asimddp`` is ``dotprod``; ``sve``, ``sve2``, ``bf16``, ``i8mm``, ``sme`` and
``sme2`` keep their names (:data:`FEATURES` maps one to the other).

The sighting's ``devices`` are the distinct core names, ``count`` the logical CPUs, and
``details`` holds ``core`` (the first core's name), ``implementer`` and ``part`` (hex
ids), and ``features`` (space-separated: the architecture, then the names of the
:data:`FEATURES` every core has, in that table's order). Without a readable
cpuinfo (macOS) the one device is an ``"Arm CPU"`` and ``count`` is :func:`os.cpu_count`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import cpuinfo_blocks, shared_words
from hwplug.platforms._sysfs import machine as host_machine
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="cpu-arm", vendor="arm", plugin_extra="cpu-arm")
ARM_MACHINES = ("aarch64", "arm64")
GENERIC_NAME = "Arm CPU"
#: cpuinfo ``Features`` word -> the feature name hwplug reports (see the module docstring).
FEATURES: Mapping[str, str] = {
    "asimd": "neon", "asimddp": "dotprod", "sve": "sve", "sve2": "sve2", "bf16": "bf16",
    "i8mm": "i8mm", "sme": "sme", "sme2": "sme2",
}
IMPLEMENTERS: Mapping[int, str] = {0x41: "Arm", 0x4E: "NVIDIA", 0x61: "Apple", 0xC0: "Ampere"}
#: ``CPU part`` of cores designed by Arm (implementer 0x41).
ARM_PARTS: Mapping[int, str] = {
    0xD08: "Cortex-A72", 0xD0B: "Cortex-A76", 0xD0C: "Neoverse N1",
    0xD40: "Neoverse V1", 0xD49: "Neoverse N2", 0xD4F: "Neoverse V2",
}


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None,
          machine: str | None = None) -> Sighting | None:
    """A sighting of the host's Arm CPU, or None on other machines. Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    machine = host_machine(root) if machine is None else machine
    if machine.lower() not in ARM_MACHINES:
        return None
    cpuinfo = root / "proc/cpuinfo"
    blocks = cpuinfo_blocks(root)
    if not blocks:
        return KIND.sighting([GENERIC_NAME], f"machine type {machine}",
                             count=os.cpu_count() or 1, details={"core": GENERIC_NAME})
    cores = [core_name(b.get("CPU implementer", ""), b.get("CPU part", "")) for b in blocks]
    shared = shared_words(blocks, "Features")
    ids = {"implementer": blocks[0].get("CPU implementer"), "part": blocks[0].get("CPU part")}
    # arm64 (macOS) is aarch64
    features = ["aarch64", *(name for word, name in FEATURES.items() if word in shared)]
    details = {"core": cores[0], "features": " ".join(features),
               **{key: value for key, value in ids.items() if value}}
    return KIND.sighting(list(dict.fromkeys(cores)), cpuinfo, count=len(blocks), details=details)


def core_name(implementer: str, part: str) -> str:
    """A core's name from cpuinfo's hex ids (``"0x41", "0xd4f"`` -> ``"Neoverse V2"``)."""
    try:
        implementer_id, part_id = int(implementer, 16), int(part, 16)
    except ValueError:
        return GENERIC_NAME
    if implementer_id == 0x41 and part_id in ARM_PARTS:
        return ARM_PARTS[part_id]
    maker = IMPLEMENTERS.get(implementer_id, f"implementer {implementer_id:#04x}")
    return f"{maker} part {part_id:#05x}"
