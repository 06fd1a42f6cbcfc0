"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from hwplug.platforms import amd


def activate() -> str | None:
    """The platform class when an AMD GPU (ROCm driver) is visible to the OS, else None."""
    return "hwplug_rocm_aiter.platform:RocmPlatform" if amd.probe() else None
