"""``XpuPlatform``: Intel GPUs through torch's ``xpu`` device."""

from __future__ import annotations

import logging
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug import registries
from hwplug.platform_interface import DeviceFacts, MemoryInfo
from hwplug_triton.platform import TritonGpuPlatform
from hwplug_xpu.devices import has_xmx, model_name

if TYPE_CHECKING:
    from hwplug.config import EngineConfig

logger = logging.getLogger(__name__)


class XpuPlatform(TritonGpuPlatform):
    """Intel Data Center GPU Max / Flex and Arc GPUs. Device queries ask torch.xpu where
    this process can drive the GPU, else the probe's sighting (PCI ids, named by
    :mod:`hwplug_xpu.devices`). intel-extension-for-pytorch is optional (extra ``ipex``)."""

    name: ClassVar[str] = "xpu"
    device_type: ClassVar[str] = "xpu"
    vendor: ClassVar[str] = "intel"
    dist_backend: ClassVar[str] = "xccl"
    #: All-to-all as all-gather + reduce-scatter (vLLM #32654).
    device_communicator: ClassVar[str | None] = "hwplug_xpu.communicator:XpuCommunicator"
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")
    #: GGUF weights through hwplug-triton's dequantizing ``ggml_linear`` / ``ggml_embedding``.
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized", "gguf")
    attention_backend_priority: ClassVar[tuple[str, ...]] = (
        "XPU_IPEX", "XPU_TRITON", "TORCH_PAGED", "XPU_TRITON_MLA", "TORCH_MLA")
    #: A block size both XPU_IPEX and XPU_TRITON accept.
    default_block_size: ClassVar[int] = 64

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        """The ``xmx`` feature (matrix engines) on the models that have them."""
        if has_xmx(facts.device_name):
            return facts.narrowed(f"{facts.device_name} has XMX matrix engines",
                                  features=facts.features | {"xmx"})
        return facts.narrowed(f"{facts.device_name} is not a GPU known to have XMX matrix "
                              "engines: IPEX's kernels are not used")

    def get_device_name(self, device_id: int = 0) -> str:
        name = super().get_device_name(device_id)
        return name if self.is_available() else model_name(name)

    def toolkit_version(self) -> str | None:
        import torch

        return getattr(torch.version, "xpu", None)

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """From torch.xpu where it drives the GPU (total minus what torch reserved)."""
        if not self.is_available():
            return super().memory_info(device_id)
        import torch

        total = torch.xpu.get_device_properties(device_id).total_memory
        return MemoryInfo(total=total, free=total - torch.xpu.memory_reserved(device_id))

    def check_and_update_config(self, config: EngineConfig) -> None:
        """The default settling, then one warning when a backend of the chosen one's kind
        (MLA or not) ahead of it in the priority list has no kernels for the model dtype
        (float32 on XPU_IPEX: the Triton backend serves it, vLLM #31762)."""
        super().check_and_update_config(config)
        priority = list(self.facts.attention_backend_priority)
        chosen = config.attention_backend
        ahead = priority[:priority.index(chosen)] if chosen in priority else []
        kind = _declared(chosen, "is_mla", False)
        lacking = tuple(name for name in ahead if _declared(name, "is_mla", False) == kind
                        and config.dtype not in _declared(name, "supported_dtypes", ()))
        if lacking:
            _warn_dtype_fallback(lacking, config.dtype, chosen)


def _declared(backend: str, fact: str, default: Any) -> Any:
    """The class attribute ``fact`` of the registered ``backend``, else ``default``."""
    try:
        return getattr(registries.attention_backends.get(backend), fact)
    except Exception:  # a backend that fails to import declares nothing it can serve
        return default


@cache
def _warn_dtype_fallback(backends: tuple[str, ...], dtype: str, chosen: str) -> None:
    """Warn once per process and case."""
    logger.warning("%s has no %s kernels: the %s model runs on %s instead (vLLM #31762)",
                   ", ".join(backends), dtype, dtype, chosen)
