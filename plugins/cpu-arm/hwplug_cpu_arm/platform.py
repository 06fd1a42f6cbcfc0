"""``ArmCpuPlatform``: Arm CPUs, ranked above the generic built-in CPU platform."""

from __future__ import annotations

from typing import ClassVar

from hwplug.platforms import arm
from hwplug.platforms.cpu import CpuPlatform


class ArmCpuPlatform(CpuPlatform):
    """An aarch64 host. bf16 compute is declared only where the core has the bf16 feature."""

    name: ClassVar[str] = "cpu-arm"
    vendor: ClassVar[str] = "arm"
    priority: ClassVar[int] = 10

    def __init__(self, sighting: object | None = None) -> None:
        # Discovery creates the platform without the probe's sighting, so read the cores'
        # features here (the probe is cheap: /proc/cpuinfo) rather than never seeing bf16.
        super().__init__(sighting if sighting is not None else arm.probe())
        features = self._features()
        if "bf16" not in features:
            self.supported_dtypes = ("float32", "float16")
            self.supported_kv_cache_dtypes = ("float32", "float16")

    def get_device_name(self, device_id: int = 0) -> str:
        details = getattr(self.sighting, "details", None) or {}
        return details.get("core", "Arm CPU")

    def canonical_device_name(self, device_id: int = 0) -> str:
        return self.get_device_name().lower().replace(" ", "-")

    def _features(self) -> set[str]:
        details = getattr(self.sighting, "details", None) or {}
        return set(details.get("features", "").split())
