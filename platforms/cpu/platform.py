"""``CpuPlatform``: the built-in CPU platform, always available, the embedded default."""

from __future__ import annotations

import os
import re
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, ClassVar

from hwplug import envs
from hwplug.platform_interface import DeviceFacts, MemoryInfo, Platform
from hwplug.platforms._sysfs import read_text

if TYPE_CHECKING:
    from hwplug.step_replay import RecordedStep, StepRecorder

class _NativeCallRecorder:
    """The CPU platform's :class:`~hwplug.step_replay.StepRecorder` (torch is imported on
    the first recording, not when a report asks for the recorder's name)."""

    name = "native kernel calls"
    records_prefill = False
    warms_up = False

    def record(self) -> AbstractContextManager[RecordedStep]:
        from hwplug.platforms.cpu.step_graph import record

        return record()

    def check_same(self, first: RecordedStep, second: RecordedStep) -> None:
        from hwplug.platforms.cpu.step_graph import same_calls

        same_calls(first, second)  # type: ignore[arg-type]


_NATIVE_CALLS = _NativeCallRecorder()
_MEMINFO = re.compile(r"^(MemTotal|MemAvailable):\s*(\d+)\s*kB", re.MULTILINE)


class CpuPlatform(Platform):
    """Any CPU, through torch's CPU kernels, hwplug's CPU variants and the references.

    Facts from the probe: float32 is the best dtype, because hwplug's fast CPU paths (the
    C kernels of a decode step, the C GEMM/GEMV, step graphs) compute in fp32, except
    where the CPU has bf16 matrix instructions (``_bf16_first_with``: x86's AMX-BF16
    tiles), whose bf16 GEMMs through oneDNN outrun any fp32 path. AVX512-BF16 alone (the
    ``bf16`` feature without AMX, as on AMD Zen 4/5) keeps bfloat16 available, second.
    """

    name: ClassVar[str] = "cpu"
    device_type: ClassVar[str] = "cpu"
    vendor: ClassVar[str] = "generic"
    is_accelerator: ClassVar[bool] = False
    dist_backend: ClassVar[str] = "gloo"
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (
        "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")
    attention_backend_priority: ClassVar[tuple[str, ...]] = ("TORCH_PAGED", "TORCH_MLA")
    #: libgomp's workers spin up to 10M iterations (milliseconds) between parallel regions,
    #: then sleep. A decode step is hundreds of small ops whose gaps are microseconds, so
    #: they never sleep mid-step (PASSIVE, no spin, halves batch-1 decode), while an idle
    #: LLM stops burning its cores (OMP_WAIT_POLICY=ACTIVE spins for tens of seconds: one
    #: core per worker). Measured by benchmarks/omp_policy.py (2-core AVX2 EPYC, SmolLM2):
    #: GGUF 48.0 tok/s vs 47.4 ACTIVE, 49.4 libgomp default, 23.3 PASSIVE; fp32 24.5 vs
    #: 25.1 ACTIVE, 23.7 default; idle 0.16 cores busy in the first 2 s vs 1.00 ACTIVE.
    #: Under oversubscription libgomp lowers the spin by itself.
    process_env: ClassVar[dict[str, str]] = {"GOMP_SPINCOUNT": "10000000"}
    #: Device features (any of them) that rank bfloat16 first: bf16 matrix instructions.
    _bf16_first_with: ClassVar[tuple[str, ...]] = ("amx_bf16",)

    def derive_facts(self, facts: DeviceFacts) -> DeviceFacts:
        matrix = sorted(set(self._bf16_first_with) & facts.features)
        if matrix and "bfloat16" in facts.supported_dtypes:
            best = ("bfloat16", *(d for d in facts.supported_dtypes if d != "bfloat16"))
            return facts.narrowed(f"the CPU has bf16 matrix instructions ({', '.join(matrix)}):"
                                  " bfloat16 ranks first", supported_dtypes=best)
        return facts

    def apply_process_env(self) -> dict[str, str]:
        """As :meth:`Platform.apply_process_env`, but nothing where the user chose an OpenMP
        wait policy (``OMP_WAIT_POLICY``), whose spin the spin count would override."""
        return {} if "OMP_WAIT_POLICY" in os.environ else super().apply_process_env()

    def device_count(self) -> int:
        return 1

    def step_recorder(self) -> StepRecorder:
        """Steps recorded as the native calls of the CPU's C kernels (see
        :mod:`hwplug.platforms.cpu.step_graph`)."""
        return _NATIVE_CALLS

    def memory_info(self, device_id: int = 0) -> MemoryInfo:
        """The host's memory (:func:`host_memory`)."""
        return host_memory()


def host_memory() -> MemoryInfo:
    """Total and available memory: ``MemTotal`` and ``MemAvailable`` of
    ``<HWPLUG_PROBE_ROOT>/proc/meminfo`` (free memory plus the page cache the kernel can
    reclaim); where that file is missing (macOS), the ``sysconf`` page counts."""
    meminfo = read_text(envs.HWPLUG_PROBE_ROOT / "proc/meminfo") or ""
    fields = {name: int(kb) * 1024 for name, kb in _MEMINFO.findall(meminfo)}
    if "MemTotal" in fields and "MemAvailable" in fields:
        return MemoryInfo(total=fields["MemTotal"], free=fields["MemAvailable"])
    pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    free = os.sysconf("SC_AVPHYS_PAGES") * page_size
    return MemoryInfo(total=pages * page_size, free=free)
