"""Entry point of group ``hwplug.platforms``: is a acme-npu device present?

hwplug calls :func:`activate` for every installed platform on first use, so it must stay
cheap: no torch, triton or jax import, no device initialisation, well under 50 ms (the
conformance kit checks both). :func:`probe` returns a ``Sighting`` of what it saw, which
hwplug hands to the platform it creates. Edit ``DEFAULT_DEVICE_NODE`` to the node your
kernel driver creates; the environment variable ``ACME_NPU_DEVICE_NODE`` overrides it
(tests, containers).
"""

from __future__ import annotations

import os
from pathlib import Path

from hwplug.platforms.sighting import Sighting, activator

#: The device node of the first acme-npu device, under the probe root. EDIT: your driver's.
DEFAULT_DEVICE_NODE = "dev/acme_npu0"
#: Environment variable naming another device node (used by this package's tests).
DEVICE_NODE_ENV = "ACME_NPU_DEVICE_NODE"
PLATFORM_CLASS = "hwplug_acme_npu.platform:AcmeNpuPlatform"


def device_node(root: Path = Path("/")) -> Path:
    """The device node this probe looks for."""
    return Path(os.environ.get(DEVICE_NODE_ENV) or root / DEFAULT_DEVICE_NODE)


def probe(root: Path = Path("/")) -> Sighting | None:
    """A sighting of the device when its node exists, else None. EDIT: name and count the
    devices from what your driver shows (sysfs, PCI ids)."""
    node = device_node(root)
    if not node.exists():
        return None
    return Sighting(vendor="acme-npu", device_kind="acme-npu", plugin_extra=None,
                    plugin_distribution="hwplug-acme-npu", devices=("acme-npu device",),
                    count=1, evidence=str(node))


activate = activator(PLATFORM_CLASS, probe)
