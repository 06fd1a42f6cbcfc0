"""Entry point of group ``hwplug.platforms``: is an Intel GPU (i915 or xe driver) visible? (cheap: the
vendor probe reads the OS, imports no torch)."""

from __future__ import annotations

from hwplug.platforms import intel_xpu
from hwplug.platforms.sighting import activator

activate = activator("hwplug_xpu.platform:XpuPlatform", intel_xpu.probe)
