"""hwplug's own registrations, made through the same hooks as any plugin."""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl
from hwplug.platform import FLOAT_DTYPES

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("REFERENCE", "hwplug.kernel_registry.attention_backend:ReferenceBackend")


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for variant in CPU_VARIANTS:
        registry.register_variant(priority=10, **variant)


@hookimpl
def hwplug_register_quant_methods(registry: Any) -> None:
    registry.register("unquantized", "hwplug.model_zoo.quantization:UnquantizedLinearMethod")


@hookimpl
def hwplug_register_models(registry: Any) -> None:
    for arch, target in BUILTIN_MODELS.items():
        if arch not in registry:
            registry.register(arch, target)


BUILTIN_MODELS = {
    "LlamaForCausalLM": "hwplug.model_zoo.models.llama:LlamaForCausalLM",
    "MistralForCausalLM": "hwplug.model_zoo.models.llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": "hwplug.model_zoo.models.llama:LlamaForCausalLM",
    "Qwen3ForCausalLM": "hwplug.model_zoo.models.qwen3:Qwen3ForCausalLM",
    "BertModel": "hwplug.model_zoo.models.bert:BertModel",
}

_CPU = "hwplug.platforms.cpu_kernels:"
_ONEDNN = "hwplug.platforms.cpu_onednn:"
#: Pure-torch variants serve every CPU platform (the built-in one and hwplug-cpu-arm's);
#: the oneDNN one is validated on x86 only.
_ANY_CPU, _X86 = ("cpu", "cpu-arm"), ("cpu",)
#: The variants hwplug adds over the references on CPUs (register_variant arguments).
CPU_VARIANTS: list[dict[str, Any]] = [
    dict(op="linear", name="onednn_packed", impl=_ONEDNN + "linear",
         supports=_ONEDNN + "supported", platforms=_X86, dtypes=("float32", "bfloat16"),
         description="oneDNN matmul on a weight reordered once into its blocked layout"),
    dict(op="rms_norm", name="torch_fused", impl=_CPU + "rms_norm", platforms=_ANY_CPU,
         dtypes=FLOAT_DTYPES, description="torch's fused F.rms_norm"),
    dict(op="rotary_embedding", name="torch_fused", impl=_CPU + "rotary_embedding",
         platforms=_ANY_CPU, dtypes=FLOAT_DTYPES,
         description="x * cos + swap(x) * sin, cos/sin expanded once per call"),
    dict(op="reshape_and_cache", name="index_copy", impl=_CPU + "reshape_and_cache",
         supports=_CPU + "cache_supported", platforms=_ANY_CPU, dtypes=FLOAT_DTYPES,
         description="one index_copy_ per half of the cache"),
    # fp32 only: torch's CPU SDPA is several times slower in bf16 than the reference
    dict(op="paged_attention", name="sdpa_decode", impl=_CPU + "decode_attention",
         supports=_CPU + "decode_supported", platforms=_ANY_CPU, dtypes=("float32",),
         description="decode batches up to 16 MiB of K/V: gather the blocks, one SDPA call"),
]
