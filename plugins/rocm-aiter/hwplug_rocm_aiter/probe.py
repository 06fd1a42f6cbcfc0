"""Entry point of group ``hwplug.platforms``: is an AMD GPU (amdgpu/ROCm driver) visible? (cheap: the
vendor probe reads the OS, imports no torch)."""

from __future__ import annotations

from hwplug.platforms import amd
from hwplug.platforms.sighting import activator

activate = activator("hwplug_rocm_aiter.platform:RocmPlatform", amd.probe)
