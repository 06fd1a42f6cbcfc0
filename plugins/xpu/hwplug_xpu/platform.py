"""``XpuPlatform``: Intel GPUs through torch's ``xpu`` device."""

from __future__ import annotations

from typing import ClassVar

from hwplug.platform_interface import MemoryInfo, Platform


class XpuPlatform(Platform):
    """Intel Data Center and Arc GPUs. intel-extension-for-pytorch is optional (extra ``ipex``).

    No attention backend is registered yet, so building a model here raises an error
    that says so instead of silently using another device.
    """

    name: ClassVar[str] = "xpu"
    device_type: ClassVar[str] = "xpu"
    vendor: ClassVar[str] = "intel"
    is_accelerator: ClassVar[bool] = True
    dist_backend: ClassVar[str] = "xccl"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ()

    def is_available(self) -> bool:
        import torch

        return hasattr(torch, "xpu") and torch.xpu.is_available()

    def get_device_name(self, device_id: int = 0) -> str:
        if not self.is_available():
            return super().get_device_name(device_id)
        import torch

        return torch.xpu.get_device_name(device_id)

    def toolkit_version(self) -> str | None:
        import torch

        return getattr(torch.version, "xpu", None)

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        import torch

        total = torch.xpu.get_device_properties(device_id).total_memory
        return MemoryInfo(total=total, free=total - torch.xpu.memory_reserved(device_id))
