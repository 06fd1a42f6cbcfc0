"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from hwplug.platforms import arm


def activate() -> str | None:
    """The platform class when an Arm CPU is visible to the OS, else None."""
    return "hwplug_cpu_arm.platform:ArmCpuPlatform" if arm.probe() else None
