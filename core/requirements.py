"""``Requirements``: where something may run, as data, with one way to say why it may not.

Kernel variants, attention backends and quant methods each state their requirements (the
platforms or families they serve, the dtypes they take, the device features, capability
range, toolkit and packages they need) and are judged by the same :meth:`Requirements.
reasons`, so the same unmet need reads the same everywhere (``hwplug kernels``, backend
selection, quant-method checks, the conformance kit).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from hwplug.device import DeviceCapability

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

__all__ = ["Requirements", "version"]


@dataclass(frozen=True)
class Requirements:
    """What a thing needs to run. Every field's empty value means "no requirement".

    ``platforms`` are platform or family names (see :meth:`~hwplug.Platform.matches`);
    ``dtypes`` the dtypes it takes (a variant's dispatch tensor, a backend's or a quant
    method's model dtype); ``features`` device features every one of which the device must
    have (its :attr:`~hwplug.Platform.facts`); the capability range is inclusive;
    ``min_toolkit`` is the vendor toolkit's lowest version; ``packages`` maps distribution
    names to PEP 440 specifiers they must satisfy.
    """

    platforms: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    min_capability: str | None = None
    max_capability: str | None = None
    min_toolkit: str | None = None
    packages: Mapping[str, str] = field(default_factory=dict)

    def reasons(self, platform: Platform | None, dtype: str | None = None,
                device_type: str | None = None) -> list[str]:
        """Why this cannot run on ``platform`` (for ``dtype``, with tensors on
        ``device_type`` when given); empty when it can. Without a platform only ``dtype``
        is judged. Gates are checked cheapest first, and a gate that fails stops the later
        ones of the device (a device that lacks a feature is not also asked for its
        toolkit)."""
        if platform is None:
            return ([f"dtype {dtype} not in {', '.join(self.dtypes)}"]
                    if dtype is not None and self.dtypes and dtype not in self.dtypes else [])
        if self.platforms and not platform.matches(self.platforms):
            return [f"serves platform {', '.join(self.platforms)}, not {platform.name}"]
        reasons = []
        if self.platforms and device_type is not None and device_type != platform.device_type:
            reasons.append(f"needs tensors on {platform.device_type}, got {device_type}")
        if dtype is not None and self.dtypes and dtype not in self.dtypes:
            reasons.append(f"dtype {dtype} not in {', '.join(self.dtypes)}")
        device = (self._feature_reason(platform) or self._capability_reason(platform)
                  or self._version_reason(platform))
        return [*reasons, device] if device else reasons

    def _feature_reason(self, platform: Platform) -> str | None:
        missing = [f for f in self.features if f not in platform.facts.features]
        if not missing:
            return None
        present = ", ".join(sorted(platform.facts.features)) or "none"
        return f"needs device feature {', '.join(missing)} ({platform.name} has: {present})"

    def _capability_reason(self, platform: Platform) -> str | None:
        if self.min_capability is None and self.max_capability is None:
            return None
        current = platform.facts.capability
        if current is None:
            return "needs a device capability; the platform reports none"
        if self.min_capability and current < DeviceCapability.parse(self.min_capability):
            return f"capability {current} below {self.min_capability}"
        if self.max_capability and current > DeviceCapability.parse(self.max_capability):
            return f"capability {current} above {self.max_capability}"
        return None

    def _version_reason(self, platform: Platform) -> str | None:
        if self.min_toolkit:
            toolkit = platform.toolkit_version()
            if toolkit is None or version(toolkit) < version(self.min_toolkit):
                return f"toolkit {toolkit or 'absent'} below {self.min_toolkit}"
        for package, spec in self.packages.items():
            try:
                installed = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                return f"package {package} not installed (needs {spec})"
            if version(installed) not in SpecifierSet(spec):
                return f"{package} {installed} does not satisfy {spec}"
        return None


def version(text: str) -> Version:
    """``text`` as a version, local part dropped (``"12.4+cu"`` -> 12.4); 0 when garbled."""
    try:
        return Version(text.split("+")[0])
    except InvalidVersion:
        return Version("0")
