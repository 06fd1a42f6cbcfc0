"""hwplug hooks of hwplug-cuda: the Triton kernel variants and the TRITON_ATTN backend.

Kernels and their ``supported`` checks are registered as lazy ``"module:function"``
strings, so triton is imported only when a variant is first considered on a CUDA device.
"""

from __future__ import annotations

from typing import Any

from hwplug import hookimpl

hwplug_api_version = ">=1,<2"

_KERNELS = "hwplug_cuda.kernels."
#: Facts shared by every Triton variant: NVIDIA only, Ampere or newer, triton present.
_TRITON = {"platforms": ("cuda",), "min_capability": "8.0", "packages": {"triton": ">=3.0"},
           "priority": 10}

#: op -> the kernel module implementing its Triton variant: the entry point named like the
#: op (registered ``.unchecked``: the registry runs the module's ``supported`` per call).
TRITON_MODULES = {
    "rms_norm": "norm",
    "rotary_embedding": "rotary",
    "silu_and_mul": "activation",
    "gelu_and_mul": "activation",
    "reshape_and_cache": "cache",
    "paged_attention": "attention",
}


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for op, module in TRITON_MODULES.items():
        registry.register_variant(op, "triton", f"{_KERNELS}{module}:{op}.unchecked",
                                  supports=f"{_KERNELS}{module}:supported",
                                  description="Triton kernel", **_TRITON)
    registry.register_variant(
        "scaled_mm", "cublaslt_fp8", "hwplug_cuda.scaled_mm:scaled_mm", platforms=("cuda",),
        dtypes=("fp8_e4m3", "fp8_e5m2"), min_capability="8.9", min_toolkit="12.1",
        supports="hwplug_cuda.scaled_mm:supported", priority=10,
        description="torch._scaled_mm (cuBLASLt fp8 GEMM)")


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("TRITON_ATTN", "hwplug_cuda.backend:TritonAttentionBackend")
