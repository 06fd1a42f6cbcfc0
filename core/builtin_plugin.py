"""hwplug's own registrations, made through the same hooks as any plugin."""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override


@hookimpl
def hwplug_register_attention_backends(registry: Any) -> None:
    registry.register("REFERENCE", "hwplug.kernel_registry.attention_backend:ReferenceBackend")


@hookimpl
def hwplug_register_kernels(registry: Any) -> None:
    for op, (name, function, supports, platforms, description) in CPU_VARIANTS.items():
        registry.register_variant(op, name, function, platforms=platforms, dtypes=("float32",),
                                  priority=10, supports=supports, description=description)


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
#: Pure-torch variants serve every CPU platform (the built-in one and hwplug-cpu-arm's);
#: the oneDNN one is validated on x86 only.
_ANY_CPU, _X86 = ("cpu", "cpu-arm"), ("cpu",)
#: op -> (variant name, function, per-call check or None, platforms, description) of the
#: fp32 variants hwplug adds over the references on CPUs.
CPU_VARIANTS = {
    "linear": ("onednn_packed", "hwplug.platforms.cpu_onednn:linear", None, _X86,
               "oneDNN matmul on a weight reordered once into its blocked layout"),
    "rms_norm": ("torch_fused", _CPU + "rms_norm", None, _ANY_CPU, "torch's fused F.rms_norm"),
    "rotary_embedding": ("torch_fused", _CPU + "rotary_embedding", None, _ANY_CPU,
                         "x * cos + swap(x) * sin, cos/sin expanded once per call"),
    "reshape_and_cache": ("index_copy", _CPU + "reshape_and_cache", _CPU + "cache_supported",
                          _ANY_CPU, "one index_copy_ per half of the cache"),
    "paged_attention": ("sdpa_decode", _CPU + "decode_attention", _CPU + "decode_supported",
                        _ANY_CPU,
                        "decode batches up to 32 MiB of K/V: gather the blocks, one SDPA call"),
}
