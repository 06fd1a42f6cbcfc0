"""Entry point of group ``hwplug.platforms``: is a Google TPU visible to the OS? (cheap: the
vendor probe reads the OS, imports no torch)."""

from __future__ import annotations

from hwplug.platforms import tpu
from hwplug.platforms.sighting import activator

activate = activator("hwplug_tpu.platform:TpuPlatform", tpu.probe)
