"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from hwplug.platforms import tpu


def activate() -> str | None:
    """The platform class when a Google TPU is visible to the OS, else None."""
    return "hwplug_tpu.platform:TpuPlatform" if tpu.probe() else None
