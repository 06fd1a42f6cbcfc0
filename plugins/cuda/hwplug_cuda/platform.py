"""``CudaPlatform``: NVIDIA GPUs through torch.cuda."""

from __future__ import annotations

import logging
from functools import cache
from typing import ClassVar

from hwplug.kernel_registry.device_names import canonical_device_name
from hwplug.platform import DeviceCapability, MemoryInfo, Platform

logger = logging.getLogger(__name__)

#: fp8 KV caches need Ada/Hopper (capability 8.9) or newer.
FP8_MIN_CAPABILITY = DeviceCapability(8, 9)
_BASE_KV_DTYPES = ("bfloat16", "float16", "float32")


def kv_cache_dtypes_for(capability: DeviceCapability | None) -> tuple[str, ...]:
    """KV-cache dtypes a device of ``capability`` can store."""
    if capability is not None and capability >= FP8_MIN_CAPABILITY:
        return (*_BASE_KV_DTYPES, "fp8_e4m3", "fp8_e5m2")
    logger.info("fp8 KV cache disabled: capability %s below %s", capability, FP8_MIN_CAPABILITY)
    return _BASE_KV_DTYPES


class CudaPlatform(Platform):
    """One or more NVIDIA GPUs. Capability-dependent facts are computed per instance."""

    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    vendor: ClassVar[str] = "nvidia"
    is_accelerator: ClassVar[bool] = True
    dist_backend: ClassVar[str] = "nccl"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = _BASE_KV_DTYPES
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized",)
    attention_backend_priority: ClassVar[tuple[str, ...]] = ("TRITON_ATTN", "REFERENCE")

    def __init__(self, sighting: object | None = None) -> None:
        super().__init__(sighting)
        if self.is_available():
            self.supported_kv_cache_dtypes = kv_cache_dtypes_for(self.get_device_capability())

    def is_available(self) -> bool:
        import torch

        return torch.cuda.is_available()

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def get_device_name(self, device_id: int = 0) -> str:
        return _device_name(device_id) if self.is_available() else "NVIDIA GPU (unavailable)"

    def canonical_device_name(self, device_id: int = 0) -> str:
        return canonical_device_name(self.get_device_name(device_id))

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if not self.is_available():
            return None
        return DeviceCapability(*_capability(device_id))

    def toolkit_version(self) -> str | None:
        import torch

        return torch.version.cuda

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        import torch

        free, total = torch.cuda.mem_get_info(device_id)
        return MemoryInfo(total=total, free=free)


@cache
def _device_name(device_id: int) -> str:
    import torch

    return torch.cuda.get_device_name(device_id)


@cache
def _capability(device_id: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(device_id)
