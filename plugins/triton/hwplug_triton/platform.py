"""``TritonGpuPlatform``: what every GPU platform that runs hwplug-triton's kernels shares.

A GPU plugin (hwplug-cuda, hwplug-rocm-aiter, hwplug-xpu) subclasses it and states its
own facts; the device queries here ask ``torch.<device_type>`` (``torch.cuda`` for NVIDIA
and AMD, ``torch.xpu`` for Intel) where this process can drive the GPU, and the probe's
sighting where it cannot (a machine without the GPU's torch build, or a fake probe root).
Importing this module imports no torch.
"""

from __future__ import annotations

from functools import cache
from typing import Any, ClassVar

from hwplug.platform_interface import MemoryInfo, Platform


class TritonGpuPlatform(Platform):
    """A GPU kind that runs what is written for Triton GPUs (its family ``triton``)."""

    families: ClassVar[tuple[str, ...]] = ("triton",)
    is_accelerator: ClassVar[bool] = True
    supported_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")

    def is_available(self) -> bool:
        module = _torch_device(self.device_type)
        return module is not None and module.is_available()

    def device_count(self) -> int:
        if self.is_available():
            return _torch_device(self.device_type).device_count()
        return super().device_count()

    def get_device_name(self, device_id: int = 0) -> str:
        if self.is_available():
            return _device_name(self.device_type, device_id)
        return super().get_device_name(device_id)

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """Free and total memory from torch where it drives the GPU."""
        if not self.is_available():
            return super().memory_info(device_id)
        free, total = _torch_device(self.device_type).mem_get_info(device_id)
        return MemoryInfo(total=total, free=free)


def _torch_device(device_type: str) -> Any:
    """``torch.<device_type>`` (``torch.cuda``, ``torch.xpu``), or None when torch has none."""
    import torch

    return getattr(torch, device_type, None)


@cache
def _device_name(device_type: str, device_id: int) -> str:
    return _torch_device(device_type).get_device_name(device_id)
