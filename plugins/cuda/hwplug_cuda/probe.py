"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from hwplug.platforms import nvidia


def activate() -> str | None:
    """The platform class when an NVIDIA GPU is visible to the OS, else None."""
    return "hwplug_cuda.platform:CudaPlatform" if nvidia.probe() else None
