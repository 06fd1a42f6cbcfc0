"""Probe for Intel GPUs (served by the ``xpu`` platform of hwplug-xpu).

Reads, under ``root``, ``/sys/class/drm/card<N>/device/{vendor,device}``: a card of vendor
``0x8086`` counts when its kernel driver is ``i915`` or ``xe``, taken from the basename
of the ``/sys/class/drm/card<N>/device/driver`` symlink, or, where that link cannot be
read, from ``/sys/bus/pci/drivers/{i915,xe}/<bus address>`` existing. GPUs are named
by PCI id (``8086:0bd5``); ``details["driver"]`` lists the drivers seen, comma-separated.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hwplug.platforms._sysfs import PciFunction, drm_cards
from hwplug.platforms.sighting import DeviceKind, Sighting

KIND = DeviceKind(name="xpu", vendor="intel", plugin_extra="xpu")
PCI_VENDOR = 0x8086
GPU_DRIVERS = ("i915", "xe")


def probe(root: Path = Path("/"), *, environ: Mapping[str, str] | None = None) -> Sighting | None:
    """A sighting of the Intel GPUs visible under ``root``, or None. Never raises on bad files.

    ``environ`` is accepted for the common probe signature and not consulted.
    """
    gpus = [(card, driver) for card in drm_cards(root, PCI_VENDOR)
            if (driver := _gpu_driver(root, card))]
    if not gpus:
        return None
    drivers = ",".join(sorted({driver for _, driver in gpus}))
    return KIND.sighting([card.pci_id for card, _ in gpus], gpus[0][0].vendor_file,
                         details={"driver": drivers})


def _gpu_driver(root: Path, card: PciFunction) -> str | None:
    """The card's driver when it is an Intel GPU driver, else None."""
    if card.driver is not None:
        return card.driver if card.driver in GPU_DRIVERS else None
    drivers = root / "sys/bus/pci/drivers"
    return next((name for name in GPU_DRIVERS if os.path.exists(drivers / name / card.address)),
                None)
