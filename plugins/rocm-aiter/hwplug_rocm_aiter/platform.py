"""``RocmPlatform``: AMD Instinct and Radeon GPUs through torch's ROCm build."""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import ClassVar

from hwplug.dtypes import FLOAT_DTYPES, FNUZ_DTYPES, FNUZ_FEATURE, FP8_KV_DTYPES
from hwplug.platform_interface import DeviceCapability, DeviceFacts, MemoryInfo
from hwplug.platforms.amd import gfx_capability
from hwplug_triton.platform import TritonGpuPlatform

#: The fp8 flavour each ISA computes in. hwplug's ``fp8_e4m3`` / ``fp8_e5m2`` are the OCP
#: formats (torch ``float8_e4m3fn`` / ``float8_e5m2``); gfx942 (MI300) computes in the fnuz
#: formats instead (hwplug's ``fp8_e4m3fnuz``), gfx950 (MI350) and RDNA4 in OCP's.
FP8_FLAVOURS = {"gfx942": "e4m3fnuz", "gfx950": "e4m3fn", "gfx1200": "e4m3fn",
                "gfx1201": "e4m3fn"}


class RocmPlatform(TritonGpuPlatform):
    """AMD GPUs. torch exposes them as the ``cuda`` device type; RCCL is the collective
    library (torch's ROCm build registers it under the ``nccl`` backend name).

    Device queries ask torch where this process can drive the GPU, else the probe's
    sighting: the name, the ISA (``gfx942``, from which the capability, ``9.4``, and the
    fp8 flavour follow) and amdgpu's VRAM counters.
    """

    name: ClassVar[str] = "rocm"
    device_type: ClassVar[str] = "cuda"
    vendor: ClassVar[str] = "amd"
    dist_backend: ClassVar[str] = "rccl"
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (
        *FLOAT_DTYPES, *FP8_KV_DTYPES, *FNUZ_DTYPES)
    #: GGUF weights through hwplug-triton's dequantizing ``ggml_linear`` / ``ggml_embedding``.
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized", "fp8", "gguf")
    attention_backend_priority: ClassVar[tuple[str, ...]] = (
        "ROCM_AITER", "ROCM_TRITON", "TORCH_PAGED", "ROCM_TRITON_MLA", "TORCH_MLA")

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        """fp8 by the ISA's flavour: OCP (gfx950, RDNA4): fp8_e4m3 / fp8_e5m2 KV caches and
        fp8 checkpoints; fnuz (gfx942): the fp8_e4m3fnuz KV cache, and fp8 checkpoints,
        which the fp8 method converts from OCP e4m3 (the device feature
        :data:`~hwplug.dtypes.FNUZ_FEATURE` says so); elsewhere no fp8, the reason
        stated."""
        target = self._gfx_target()
        flavour = FP8_FLAVOURS.get(target or "")
        if flavour == "e4m3fn":
            return facts.without_dtypes(
                FNUZ_DTYPES, f"fp8 flavour e4m3fn (OCP) on {target}: fp8 KV caches fp8_e4m3 "
                             "/ fp8_e5m2 and fp8 checkpoints")
        if flavour == "e4m3fnuz":
            facts = facts.without_dtypes(
                FP8_KV_DTYPES, f"fp8 flavour e4m3fnuz on {target}: the fp8 KV cache is "
                               "fp8_e4m3fnuz (not OCP fp8_e4m3 / fp8_e5m2), and OCP e4m3 fp8 "
                               "checkpoints are converted to e4m3fnuz, their scales doubled")
            return dataclasses.replace(facts, features=facts.features | {FNUZ_FEATURE})
        facts = facts.without_dtypes((*FP8_KV_DTYPES, *FNUZ_DTYPES),
                                     f"no fp8 on {target or 'an unknown ISA'}: no fp8 KV "
                                     "cache or checkpoint")
        return dataclasses.replace(facts, supported_quant_methods=tuple(
            m for m in facts.supported_quant_methods if m != "fp8"))

    def is_available(self) -> bool:
        import torch

        return torch.version.hip is not None and super().is_available()

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if self.is_available():
            import torch

            return DeviceCapability(*torch.cuda.get_device_capability(device_id))
        known = gfx_capability(self._gfx_target() or "")
        return DeviceCapability.parse(known) if known else None

    def toolkit_version(self) -> str | None:
        import torch

        return torch.version.hip

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """From torch where it drives the GPU, else amdgpu's VRAM counters the probe read."""
        total = self._sighting_detail("vram_total")
        if self.is_available() or not total:
            return super().memory_info(device_id)
        return MemoryInfo(total=int(total),
                          free=int(total) - int(self._sighting_detail("vram_used", "0")))

    def _gfx_target(self) -> str | None:
        """The first GPU's ISA: from torch where it drives the GPU, else the sighting's."""
        if self.is_available():
            return _gcn_arch(0)
        targets = self._sighting_detail("gfx_targets")
        return targets.split(",")[0] if targets else None


@cache
def _gcn_arch(device_id: int) -> str:
    import torch

    return torch.cuda.get_device_properties(device_id).gcnArchName.split(":")[0]
