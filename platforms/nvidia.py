"""Probe for NVIDIA GPUs (served by the ``cuda`` platform of hwplug-cuda).

Reads, under ``root``, the first of these that shows a GPU:

1. ``/proc/driver/nvidia/gpus/<bus id>/information`` (one per GPU; its ``Model:`` line
   names the GPU, else the bus id stands in);
2. ``/sys/bus/pci/devices/*/{vendor,device,class}``: vendor ``0x10de`` with a display
   class ``0x03xxxx`` (the GPU is there though the driver may be missing);
3. ``/dev/nvidia<N>`` device nodes.

``/proc/driver/nvidia/version`` adds ``details["driver_version"]``; the first GPU's PCI
device id (``/sys/bus/pci/devices/<bus id>/device``), where :data:`CAPABILITIES` knows it,
adds ``details["capability"]`` (``"9.0"``), so facts that depend on the compute
capability are known before any CUDA runtime is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import numbered, parse_fields, pci_functions, read_hex, read_text
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="cuda", vendor="nvidia", plugin_extra="cuda")
PCI_VENDOR = 0x10DE
_DISPLAY_CLASS = 0x03
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*")
#: PCI device id -> CUDA compute capability, for the data-center and common workstation GPUs.
CAPABILITIES: Mapping[int, str] = {
    0x1DB1: "7.0", 0x1DB4: "7.0", 0x1DB5: "7.0", 0x1DB6: "7.0",  # V100
    0x1EB8: "7.5",  # T4
    0x20B0: "8.0", 0x20B1: "8.0", 0x20B2: "8.0", 0x20B3: "8.0", 0x20B5: "8.0",  # A100
    0x20F1: "8.0", 0x20B7: "8.0",  # A100 PCIe, A30
    0x2235: "8.6", 0x2236: "8.6", 0x2237: "8.6", 0x2204: "8.6",  # A40, A10, A10G, RTX 3090
    0x27B8: "8.9", 0x26B5: "8.9", 0x26B9: "8.9", 0x2684: "8.9",  # L4, L40, L40S, RTX 4090
    0x2330: "9.0", 0x2331: "9.0", 0x2321: "9.0", 0x2335: "9.0", 0x2342: "9.0",  # H100/H200/GH200
    0x2901: "10.0", 0x2941: "10.0",  # B200, GB200
}


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting | None:
    """A sighting of the NVIDIA GPUs visible under ``root``, or None. Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    details = _driver_details(root)
    gpus = sorted((root / "proc/driver/nvidia/gpus").glob("*/information"))
    if gpus:
        names = [parse_fields(read_text(info) or "").get("Model") or info.parent.name
                 for info in gpus]
        device = read_hex(root / "sys/bus/pci/devices" / gpus[0].parent.name / "device")
        return KIND.sighting(names, gpus[0], details={**details, **_capability(device)})
    functions = [f for f in pci_functions(root, PCI_VENDOR)
                 if f.class_code is not None and f.class_code >> 16 == _DISPLAY_CLASS]
    if functions:
        return KIND.sighting([f.pci_id for f in functions], functions[0].vendor_file,
                             details={**details, **_capability(functions[0].device)})
    nodes = numbered(root / "dev", "nvidia")
    if nodes:
        return KIND.sighting([node.name for node in nodes], nodes[0], details=details)
    return None


def _capability(device_id: int | None) -> dict[str, str]:
    known = CAPABILITIES.get(device_id) if device_id is not None else None
    return {"capability": known} if known else {}


def _driver_details(root: Path) -> dict[str, str]:
    text = read_text(root / "proc/driver/nvidia/version") or ""
    match = _VERSION.search(text.partition("\n")[0])
    return {"driver_version": match.group()} if match else {}
