"""``CudaPlatform``: NVIDIA GPUs through torch.cuda."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, ClassVar

from hwplug.platform_interface import DeviceCapability, DeviceFacts
from hwplug_triton.platform import TritonGpuPlatform

if TYPE_CHECKING:
    from hwplug_cuda.cuda_graph import CudaGraphRecorder

#: fp8 KV caches need Ada/Hopper (capability 8.9) or newer.
FP8_MIN_CAPABILITY = DeviceCapability(8, 9)
FP8_KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")


class CudaPlatform(TritonGpuPlatform):
    """One or more NVIDIA GPUs. Device queries ask torch.cuda where this process can
    drive the GPU, else the probe's sighting (name, and capability by PCI id)."""

    name: ClassVar[str] = "cuda"
    device_type: ClassVar[str] = "cuda"
    vendor: ClassVar[str] = "nvidia"
    dist_backend: ClassVar[str] = "nccl"
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (
        "bfloat16", "float16", "float32", *FP8_KV_DTYPES)
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized", "fp8", "int8", "gguf")
    attention_backend_priority: ClassVar[tuple[str, ...]] = (
        "TRITON_ATTN", "TORCH_PAGED", "TRITON_MLA", "TORCH_MLA")

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        capability = facts.capability
        if capability is None or capability < FP8_MIN_CAPABILITY:
            return facts.without_dtypes(
                FP8_KV_DTYPES, f"fp8 KV cache needs capability {FP8_MIN_CAPABILITY}, the "
                               f"device has {capability or 'none known'}")
        return facts

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if self.is_available():
            return DeviceCapability(*_capability(device_id))
        known = self._sighting_detail("capability")
        return DeviceCapability.parse(known) if known else None

    def step_recorder(self) -> CudaGraphRecorder | None:
        """Decode steps captured as CUDA graphs (:mod:`hwplug_cuda.cuda_graph`) where this
        process drives the GPU; None where it does not."""
        if not self.is_available():
            return None
        from hwplug_cuda.cuda_graph import RECORDER

        return RECORDER

    def toolkit_version(self) -> str | None:
        import torch

        return torch.version.cuda


@cache
def _capability(device_id: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(device_id)
