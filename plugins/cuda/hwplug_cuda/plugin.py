"""hwplug hooks of hwplug-cuda: hwplug-triton's kernels gated for NVIDIA GPUs, cuBLASLt fp8
``scaled_mm`` and the TRITON_ATTN and TRITON_MLA backends.

Everything is registered lazily (``"module:function"``), so triton and torch are imported
only when a variant is first considered on a CUDA device.
"""

from __future__ import annotations

from typing import Any

import hwplug_triton
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

#: The Triton kernels need Ampere or newer (bf16 dots, async copies).
TRITON_MIN_CAPABILITY = "8.0"


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    hwplug_triton.register(registry, platforms=("cuda",), min_capability=TRITON_MIN_CAPABILITY)
    registry.register_variant(
        "scaled_mm", "cublaslt_fp8", "hwplug_cuda.scaled_mm:scaled_mm", platforms=("cuda",),
        dtypes=("fp8_e4m3", "fp8_e5m2"), min_capability="8.9", min_toolkit="12.1",
        supports="hwplug_cuda.scaled_mm:supported", priority=10,
        description="torch._scaled_mm (cuBLASLt fp8 GEMM)")
    # block scales (DeepSeek-V3), which cuBLASLt declines
    hwplug_triton.register(registry, platforms=("cuda",), ops=hwplug_triton.FP8_OPS,
                           min_capability="8.9", priority=5)


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("TRITON_ATTN", "hwplug_cuda.backend:TritonAttentionBackend")
    registry.register("TRITON_MLA", "hwplug_cuda.backend:TritonMLABackend")
