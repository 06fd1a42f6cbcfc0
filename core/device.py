"""What a device is and can do, as plain data: its capability, memory and facts.

These types carry no behaviour beyond their own: :class:`~hwplug.Platform` computes them,
and the interfaces below it (attention backends, kernel variants, quant methods) read
them without importing the platform.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceCapability", "DeviceFacts", "MemoryInfo"]


@dataclass(frozen=True, order=True)
class DeviceCapability:
    """A device's feature level, e.g. CUDA compute capability 8.9 -> ``(8, 9)``."""

    major: int
    minor: int = 0

    @classmethod
    def parse(cls, value: str | tuple[int, int] | DeviceCapability) -> DeviceCapability:
        if isinstance(value, DeviceCapability):
            return value
        if isinstance(value, tuple):
            return cls(*value)
        major, _, minor = str(value).partition(".")
        return cls(int(major), int(minor or 0))

    def as_int(self) -> int:
        return self.major * 10 + self.minor

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


@dataclass(frozen=True)
class MemoryInfo:
    """Device memory in bytes."""

    total: int
    free: int


@dataclass(frozen=True)
class DeviceFacts:
    """What the platform's device is and can do here, computed once per platform instance.

    ``supported_*`` and ``attention_backend_priority`` start as the class's lists and are
    narrowed to the device; each narrowing is explained in ``notes``. ``features`` are
    the device features the probe saw (CPU flags such as ``avx2`` or ``bf16``, the
    architecture); kernel variants may require some. ``available`` is whether this
    process can drive the device (:meth:`Platform.is_available`).
    """

    device_name: str
    canonical_name: str
    device_count: int
    capability: DeviceCapability | None
    features: frozenset[str]
    supported_dtypes: tuple[str, ...]
    supported_kv_cache_dtypes: tuple[str, ...]
    supported_quant_methods: tuple[str, ...] | None
    attention_backend_priority: tuple[str, ...]
    available: bool
    notes: tuple[str, ...] = ()

    def narrowed(self, reason: str, **changes: Any) -> DeviceFacts:
        """A copy with ``changes`` applied and ``reason`` added to :attr:`notes`."""
        return dataclasses.replace(self, **changes, notes=(*self.notes, reason))

    def without_dtypes(self, names: Iterable[str], reason: str) -> DeviceFacts:
        """A copy without the dtypes ``names`` (compute and KV cache), noting ``reason``."""
        drop = set(names)
        return self.narrowed(
            reason, supported_dtypes=tuple(d for d in self.supported_dtypes if d not in drop),
            supported_kv_cache_dtypes=tuple(d for d in self.supported_kv_cache_dtypes
                                            if d not in drop))
