"""Entry point of group ``hwplug.platforms``: is an NVIDIA GPU visible to the OS? (cheap: the
vendor probe reads the OS, imports no torch)."""

from __future__ import annotations

from hwplug.platforms import nvidia
from hwplug.platforms.sighting import activator

activate = activator("hwplug_cuda.platform:CudaPlatform", nvidia.probe)
