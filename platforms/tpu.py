"""Probe for Google TPUs (served by the ``tpu`` platform of hwplug-tpu).

Reads, under ``root``, the first of these that shows a TPU:

1. ``/sys/bus/pci/devices/*/{vendor,device}``: vendor ``0x1ae0`` (Google) with a TPU
   device id from :data:`TPU_CHIPS`, which also names the chip generation (Google's
   other PCI functions on cloud VMs, such as gVNIC and NVMe, do not count);
2. the device nodes ``/dev/accel<N>`` (TPU v2-v4) or ``/dev/vfio/<N>`` (v5e and later),
   counted only when ``TPU_ACCELERATOR_TYPE`` is set, since such nodes alone do not
   say they are TPUs.

From ``environ`` (default ``os.environ``; not root-relative) ``TPU_ACCELERATOR_TYPE`` and
``TPU_NAME`` become ``details["accelerator_type"]`` and ``details["tpu_name"]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import numbered, pci_functions
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="tpu", vendor="google", plugin_extra="tpu")
PCI_VENDOR = 0x1AE0
#: PCI device id -> chip generation.
TPU_CHIPS: Mapping[int, str] = {
    0x0027: "TPU v2/v3", 0x005E: "TPU v4", 0x0062: "TPU v5p", 0x0063: "TPU v5e",
    0x006F: "TPU v6e", 0x0076: "TPU7x",
}
_ENV_DETAILS = {"TPU_ACCELERATOR_TYPE": "accelerator_type", "TPU_NAME": "tpu_name"}


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting | None:
    """A sighting of the TPU chips visible under ``root``, or None. Never raises on bad files."""
    environ = os.environ if environ is None else environ
    details = {key: environ[var] for var, key in _ENV_DETAILS.items() if environ.get(var)}
    chips = [f for f in pci_functions(root, PCI_VENDOR) if f.device in TPU_CHIPS]
    if chips:
        return KIND.sighting([TPU_CHIPS[chip.device] for chip in chips], chips[0].vendor_file,
                             details=details)
    dev = root / "dev"
    nodes = numbered(dev, "accel") or numbered(dev / "vfio")
    if nodes and "accelerator_type" in details:
        return KIND.sighting([str(node.relative_to(dev)) for node in nodes], nodes[0],
                             details=details)
    return None
