"""``ArmCpuPlatform``: Arm CPUs, ranked above the generic built-in CPU platform."""

from __future__ import annotations

from typing import ClassVar

from hwplug.platform_interface import DeviceFacts
from hwplug.platforms.cpu.platform import CpuPlatform


class ArmCpuPlatform(CpuPlatform):
    """An aarch64 host; a ``cpu``, so every CPU variant and backend serves it. Named after
    its core (from the probe); bf16 compute only where every core has the bf16 feature."""

    name: ClassVar[str] = "cpu-arm"
    vendor: ClassVar[str] = "arm"
    families: ClassVar[tuple[str, ...]] = ("cpu",)
    priority: ClassVar[int] = 10
    #: Arm's bf16 extension includes BFMMLA, a bf16 matrix multiply: bfloat16 ranks first.
    _bf16_first_with: ClassVar[tuple[str, ...]] = ("bf16",)

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        facts = super().derive_facts(facts)
        if "bf16" not in facts.features:
            return facts.without_dtypes(["bfloat16"], "the cores lack the bf16 extension")
        return facts
