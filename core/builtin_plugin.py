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
    registry.register_variant(
        "linear", "onednn_packed", "hwplug.platforms.cpu_kernels:linear", platforms=("cpu",),
        dtypes=("float32",), priority=10,
        description="oneDNN matmul on a weight reordered once into its blocked layout")


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
