"""``RocmPlatform``: AMD Instinct and Radeon GPUs through torch's ROCm build."""

from __future__ import annotations

from typing import ClassVar

from hwplug.platform_interface import DeviceCapability, MemoryInfo, Platform


class RocmPlatform(Platform):
    """AMD GPUs. torch exposes them as the ``cuda`` device type; RCCL serves as ``nccl``.

    No attention backend is registered yet (AITER kernels are future work), so building
    a model here raises an error that says so instead of silently using another device.
    Device queries ask torch where this process can drive the GPU, else the sighting.
    """

    name: ClassVar[str] = "rocm"
    device_type: ClassVar[str] = "cuda"
    vendor: ClassVar[str] = "amd"
    is_accelerator: ClassVar[bool] = True
    dist_backend: ClassVar[str] = "nccl"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ()

    def is_available(self) -> bool:
        import torch

        return torch.cuda.is_available() and torch.version.hip is not None

    def get_device_name(self, device_id: int = 0) -> str:
        if not self.is_available():
            return super().get_device_name(device_id)
        import torch

        return torch.cuda.get_device_name(device_id)

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if not self.is_available():
            return None
        import torch

        return DeviceCapability(*torch.cuda.get_device_capability(device_id))

    def toolkit_version(self) -> str | None:
        import torch

        return torch.version.hip

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        import torch

        free, total = torch.cuda.mem_get_info(device_id)
        return MemoryInfo(total=total, free=free)
