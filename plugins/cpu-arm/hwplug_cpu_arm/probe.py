"""Entry point of group ``hwplug.platforms``: is this an Arm host? (cheap: the
vendor probe reads the OS, imports no torch)."""

from __future__ import annotations

from hwplug.platforms import arm
from hwplug.platforms.sighting import activator

activate = activator("hwplug_cpu_arm.platform:ArmCpuPlatform", arm.probe)
