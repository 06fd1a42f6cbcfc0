"""Probe of the host CPU for the built-in ``cpu`` platform, and its entry point.

Reads, under ``root``, ``/proc/sys/kernel/arch`` (the architecture) and ``/proc/cpuinfo``:
the CPU's name, the logical CPUs, and the features every CPU has among those hwplug's
kernels care about (:data:`X86_FEATURES`; on Arm, those of
:data:`hwplug.platforms.arm.FEATURES`, under the names it gives them: ``neon``,
``dotprod``, ``i8mm``, ...).
Two features mean the same on every architecture: the architecture itself (``x86_64``,
``aarch64``) and ``bf16``, bf16 arithmetic in hardware (x86: AVX512-BF16 or AMX-BF16).
A CPU is always there, so the probe always returns a sighting. Standard library only.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms import arm
from hwplug.platforms._sysfs import cpuinfo_blocks, machine, shared_words
from hwplug.platforms.sighting import DeviceKind, Sighting, activator

KIND = DeviceKind(name="cpu", vendor="generic", plugin_extra=None)
PLATFORM_CLASS = "hwplug.platforms.cpu.platform:CpuPlatform"
#: x86 flags (as /proc/cpuinfo spells them) that kernel variants may require.
X86_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
#: x86 flags that give bf16 arithmetic in hardware.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting:
    """A sighting of the host CPU (never None). Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    arch = machine(root).lower()
    arm_cpu = arm.probe(root, machine=arch)
    if arm_cpu is not None:
        features = set(arm_cpu.details.get("features", "").split())
        name, count, evidence = arm_cpu.devices[0], arm_cpu.count, arm_cpu.evidence
    else:
        blocks = cpuinfo_blocks(root)
        flags = shared_words(blocks, "flags")
        features = flags & set(X86_FEATURES)
        if flags & set(BF16_FLAGS):
            features.add("bf16")
        name = (blocks[0].get("model name") if blocks else None) or platform.processor() or arch
        count = len(blocks) or os.cpu_count() or 1
        evidence = str(root / "proc/cpuinfo") if blocks else f"machine type {arch}"
        features.add(arch)
    return KIND.sighting([name], evidence, count=count,
                         details={"arch": arch, "features": " ".join(sorted(features))})


#: The ``hwplug.platforms`` entry point of the built-in CPU platform (always active).
activate = activator(PLATFORM_CLASS, probe)
