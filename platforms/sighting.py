"""What a hardware probe saw, which hwplug plugin serves that hardware, and the answer a
``hwplug.platforms`` entry point gives discovery (:class:`Activation`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["Activation", "DeviceKind", "Sighting", "activator"]


@dataclass(frozen=True)
class Sighting:
    """Hardware found by a probe.

    Attributes:
        vendor: who makes it (``"nvidia"``).
        device_kind: the platform name its plugin registers (``"cuda"``, ``"rocm"``,
            ``"xpu"``, ``"tpu"``, ``"cpu-arm"``); also the ``HWPLUG_PLATFORM`` value.
        plugin_extra: the ``hwplug`` extra that installs the plugin (``"rocm-aiter"``);
            None where no extra names it (any CPU, which hwplug serves itself; a
            third-party plugin).
        plugin_distribution: the distribution that serves it (``"hwplug-rocm-aiter"``,
            ``"hwplug"``).
        devices: names, or PCI ids where no name is known, of what was seen.
        count: how many devices (GPUs, chips, logical CPUs) the plugin's runtime will see.
        evidence: the file (or fact) that proved the hardware is there.
        details: extra facts, all strings (driver version, CPU core name, ...); read-only.
    """

    vendor: str
    device_kind: str
    plugin_extra: str | None
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
        return f'pip install "hwplug[{self.plugin_extra}]"' if self.plugin_extra else (
            f"pip install {self.plugin_distribution}")


@dataclass(frozen=True)
class DeviceKind:
    """A kind of hardware hwplug knows: its platform name, vendor and serving plugin.

    Each probe module declares one as ``KIND`` and builds its sightings with
    :meth:`sighting`, so the plugin facts are stated once per kind.
    """

    name: str
    vendor: str
    plugin_extra: str | None

    @property
    def plugin_distribution(self) -> str:
        return f"hwplug-{self.plugin_extra}" if self.plugin_extra else "hwplug"

    def sighting(self, devices: Iterable[str], evidence: Path | str, count: int | None = None,
                 details: Mapping[str, str] | None = None) -> Sighting:
        """A :class:`Sighting` of this kind; ``count`` defaults to the number of devices."""
        devices = tuple(devices)
        return Sighting(self.vendor, self.name, self.plugin_extra, self.plugin_distribution,
                        devices, len(devices) if count is None else count, str(evidence),
                        details or {})


@dataclass(frozen=True)
class Activation:
    """What a ``hwplug.platforms`` entry point returns when its hardware is present: the
    ``"module:Class"`` of its :class:`~hwplug.Platform` and the probe's sighting, which
    discovery hands to the platform it creates (returning just the string is allowed and
    gives a platform without a sighting)."""

    platform: str
    sighting: Sighting | None = None


def activator(platform: str, probe: Callable[..., Sighting | None]
              ) -> Callable[..., Activation | None]:
    """A ``hwplug.platforms`` entry point: ``activate(root=Path("/"), **probe_options)``
    runs ``probe(root, **probe_options)`` and answers ``Activation(platform, sighting)``
    when it saw hardware, else None. A plugin's probe module is typically one line,
    ``activate = activator("my_pkg.platform:MyPlatform", my_probe)``."""

    def activate(root: Path = Path("/"), **probe_options: Any) -> Activation | None:
        sighting = probe(root, **probe_options)
        return Activation(platform, sighting) if sighting is not None else None

    activate.__doc__ = f"Activation({platform!r}, sighting) when {probe.__module__} sees " \
                       "hardware under root, else None."
    return activate
