"""Probe for NVIDIA GPUs (served by the ``cuda`` platform of hwplug-cuda).

Reads, under ``root``, the first of these that shows a GPU:

1. ``/proc/driver/nvidia/gpus/<bus id>/information`` (one per GPU; its ``Model:`` line
   names the GPU, else the bus id stands in);
2. ``/sys/bus/pci/devices/*/{vendor,device,class}``: vendor ``0x10de`` with a display
   class ``0x03xxxx`` (the GPU is there though the driver may be missing);
3. ``/dev/nvidia<N>`` device nodes.

``/proc/driver/nvidia/version`` adds ``details["driver_version"]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import numbered, parse_fields, pci_functions, read_text
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="cuda", vendor="nvidia", plugin_extra="cuda")
PCI_VENDOR = 0x10DE
_DISPLAY_CLASS = 0x03
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting | None:
    """A sighting of the NVIDIA GPUs visible under ``root``, or None. Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    details = _driver_details(root)
    gpus = sorted((root / "proc/driver/nvidia/gpus").glob("*/information"))
    if gpus:
        names = [parse_fields(read_text(info) or "").get("Model") or info.parent.name
                 for info in gpus]
        return KIND.sighting(names, gpus[0], details=details)
    functions = [f for f in pci_functions(root, PCI_VENDOR)
                 if f.class_code is not None and f.class_code >> 16 == _DISPLAY_CLASS]
    if functions:
        return KIND.sighting([f.pci_id for f in functions], functions[0].vendor_file,
                             details=details)
    nodes = numbered(root / "dev", "nvidia")
    if nodes:
        return KIND.sighting([node.name for node in nodes], nodes[0], details=details)
    return None


def _driver_details(root: Path) -> dict[str, str]:
    text = read_text(root / "proc/driver/nvidia/version") or ""
    match = _VERSION.search(text.partition("\n")[0])
    return {"driver_version": match.group()} if match else {}
