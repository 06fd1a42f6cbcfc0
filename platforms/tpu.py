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

:func:`generation` reads a sighting's chip generation (:data:`GENERATIONS`: its feature
level and HBM per chip) from the PCI chip name or, where only device nodes were seen, from
the accelerator type (``v5litepod-4`` is a v5e).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Generation:
    """A TPU chip generation: its name (``"v5e"``), feature level ``(major, minor)``
    (``e``/lite chips minor 0, ``p``/performance chips minor 1) and HBM per chip."""

    name: str
    level: tuple[int, int]
    hbm_gib: int


#: Generation name -> its facts (Google Cloud's published chip specifications).
GENERATIONS: Mapping[str, Generation] = {g.name: g for g in (
    Generation("v2", (2, 0), 16), Generation("v3", (3, 0), 32), Generation("v4", (4, 0), 32),
    Generation("v5e", (5, 0), 16), Generation("v5p", (5, 1), 95), Generation("v6e", (6, 0), 32),
    Generation("7x", (7, 0), 192),
)}
#: First word of an accelerator type (``v5litepod-4``) -> generation name, where they differ.
_ACCELERATOR_ALIASES = {"v5litepod": "v5e", "tpu7x": "7x", "v7x": "7x"}
#: PCI chip name -> generation; ``TPU v2/v3`` share a device id: the lower one is assumed.
_CHIP_GENERATIONS = {"TPU v2/v3": "v2", "TPU v4": "v4", "TPU v5p": "v5p", "TPU v5e": "v5e",
                     "TPU v6e": "v6e", "TPU7x": "7x"}


def generation(sighting: Sighting) -> Generation | None:
    """The chip generation of a TPU sighting: from its accelerator type when set (it also
    tells v2 from v3), else from its first device's PCI chip name; None when neither says."""
    accelerator = sighting.details.get("accelerator_type", "").lower().split("-")[0]
    name = _ACCELERATOR_ALIASES.get(accelerator, accelerator)
    if name not in GENERATIONS and sighting.devices:
        name = _CHIP_GENERATIONS.get(sighting.devices[0], "")
    return GENERATIONS.get(name)


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
