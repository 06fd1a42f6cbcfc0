"""Entry point of group ``hwplug.platforms``: cheap, imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hwplug.platforms import nvidia


def activate(root: Path = Path("/"), **probe_options: Any) -> str | None:
    """The platform class when an NVIDIA GPU is visible to the OS, else None.

    ``root`` and ``probe_options`` go to the vendor probe (tests hand it a fake tree).
    """
    return "hwplug_cuda.platform:CudaPlatform" if nvidia.probe(root, **probe_options) else None
