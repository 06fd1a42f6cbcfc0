"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from hwplug.platforms import intel_xpu


def activate() -> str | None:
    """The platform class when an Intel GPU (i915 or xe driver) is visible to the OS, else None."""
    return "hwplug_xpu.platform:XpuPlatform" if intel_xpu.probe() else None
