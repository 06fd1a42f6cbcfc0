"""The built-in CPU reference platform: always available, the embedded default."""

from __future__ import annotations

import os
import platform as _host
from typing import ClassVar

from hwplug.platform import MemoryInfo, Platform


class CpuPlatform(Platform):
    """Any CPU, through torch's CPU kernels and hwplug's reference ops."""

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    vendor: ClassVar[str] = "generic"
    is_accelerator: ClassVar[bool] = False
    dist_backend: ClassVar[str] = "gloo"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_quant_methods: ClassVar[tuple[str, ...]] = ("unquantized",)
    attention_backend_priority: ClassVar[tuple[str, ...]] = ("REFERENCE",)
    #: OpenMP workers spin between parallel regions instead of sleeping: a decode step is
    #: hundreds of small ops between the matmuls, and waking sleeping workers for each
    #: costs more than the ops (SmolLM2 fp32 batch 1 on 2 cores: 43-50 -> 55 tokens/s).
    process_env: ClassVar[dict[str, str]] = {"OMP_WAIT_POLICY": "ACTIVE"}

    def get_device_name(self, device_id: int = 0) -> str:
        return _host.processor() or _host.machine()

    def canonical_device_name(self, device_id: int = 0) -> str:
        return f"cpu-{_host.machine().lower()}"

    def device_count(self) -> int:
        return 1

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * page_size
        return MemoryInfo(total=pages * page_size, free=free)
