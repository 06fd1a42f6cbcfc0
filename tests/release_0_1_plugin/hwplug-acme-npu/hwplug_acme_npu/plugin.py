"""hwplug hooks of hwplug-acme-npu: what this plugin registers when hwplug loads it.

hwplug imports this module (entry point group ``hwplug.plugins``) once per process, checks
``hwplug_api_version`` against its plugin API, and calls each ``@hookimpl`` function with
the registry to fill. Implementations are registered as lazy ``"module:attr"`` strings, so
nothing heavy is imported until hwplug first uses them.
"""

from __future__ import annotations

from typing import Any

from hwplug import hookimpl

#: The hwplug plugin API versions this plugin is written against.
hwplug_api_version = ">=1,<2"


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    registry.register_variant(
        "silu_and_mul", "acme_npu", "hwplug_acme_npu.kernels:silu_and_mul",
        platforms=("acme-npu",), dtypes=("bfloat16", "float16", "float32"), priority=10,
        description="acme-npu silu_and_mul")
    registry.register_variant(
        "paged_attention", "acme_npu", "hwplug_acme_npu.kernels:paged_attention",
        platforms=("acme-npu",), dtypes=("bfloat16", "float16", "float32"), priority=10,
        description="acme-npu paged_attention (release 0.1's signature)")


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("ACME_NPU_ATTN", "hwplug_acme_npu.attention:AcmeNpuAttentionBackend")
