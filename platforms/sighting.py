"""What a hardware probe saw, and which hwplug plugin serves that hardware."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType


@dataclass(frozen=True)
class Sighting:
    """Hardware found by a probe.

    Attributes:
        vendor: who makes it (``"nvidia"``).
        device_kind: the platform name its plugin registers (``"cuda"``, ``"rocm"``,
            ``"xpu"``, ``"tpu"``, ``"cpu-arm"``); also the ``HWPLUG_PLATFORM`` value.
        plugin_extra: the ``hwplug`` extra that installs the plugin (``"rocm-aiter"``).
        plugin_distribution: the plugin's distribution name (``"hwplug-rocm-aiter"``).
        devices: names, or PCI ids where no name is known, of what was seen.
        count: how many devices (GPUs, chips, logical CPUs) the plugin's runtime will see.
        evidence: the file (or fact) that proved the hardware is there.
        details: extra facts, all strings (driver version, CPU core name, ...); read-only.
    """

    vendor: str
    device_kind: str
    plugin_extra: str
    plugin_distribution: str
    devices: tuple[str, ...]
    count: int
    evidence: str
    details: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    @property
    def install_hint(self) -> str:
        """The command that installs the plugin: ``pip install "hwplug[rocm-aiter]"``."""
        return f'pip install "hwplug[{self.plugin_extra}]"'


@dataclass(frozen=True)
class DeviceKind:
    """A kind of hardware hwplug knows: its platform name, vendor and serving plugin.

    Each probe module declares one as ``KIND`` and builds its sightings with
    :meth:`sighting`, so the plugin facts are stated once per kind.
    """

    name: str
    vendor: str
    plugin_extra: str

    @property
    def plugin_distribution(self) -> str:
        return f"hwplug-{self.plugin_extra}"

    def sighting(self, devices: Iterable[str], evidence: Path | str, count: int | None = None,
                 details: Mapping[str, str] | None = None) -> Sighting:
        """A :class:`Sighting` of this kind; ``count`` defaults to the number of devices."""
        devices = tuple(devices)
        return Sighting(self.vendor, self.name, self.plugin_extra, self.plugin_distribution,
                        devices, len(devices) if count is None else count, str(evidence),
                        details or {})
