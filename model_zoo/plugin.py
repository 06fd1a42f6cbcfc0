"""hwplug hooks of the model zoo: its architectures, quant methods, KV connectors and
speculative decoding's proposers.

Loaded like any plugin (entry point ``hwplug-models`` of group ``hwplug.plugins`` in
hwplug's own distribution). Architectures registered in code before discovery keep their
registration.
"""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override

#: The architectures each model-zoo class serves (Mistral and Qwen2 checkpoints are Llama's
#: architecture with other hyperparameters).
_SERVED_BY = {
    "llama:LlamaForCausalLM": ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"),
    "qwen3:Qwen3ForCausalLM": ("Qwen3ForCausalLM",),
    "moe:Qwen3MoeForCausalLM": ("Qwen3MoeForCausalLM",),
    "moe:MixtralForCausalLM": ("MixtralForCausalLM",),
    "deepseek:DeepseekV3ForCausalLM": ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"),
    "bert:BertModel": ("BertModel",),
}
BUILTIN_MODELS = {architecture: f"hwplug.model_zoo.models.{target}"
                  for target, architectures in _SERVED_BY.items()
                  for architecture in architectures}


_QUANT = "hwplug.model_zoo.quant_methods."
QUANT_METHODS = {
    "unquantized": _QUANT + "unquantized:UnquantizedLinearMethod",
    "fp8": _QUANT + "scaled:Fp8LinearMethod",
    "int8": _QUANT + "scaled:Int8LinearMethod",
    "int4": _QUANT + "int4:Int4LinearMethod",
    "gguf": _QUANT + "gguf:GgufMethod",
}
#: Methods other engines retired, each with what to run instead (vLLM #32688, #32683).
REMOVED_QUANT_METHODS = {"marlin-24": "int8", "bitblas": "int8"}


def _register_all(registry: Any, targets: dict[str, str]) -> None:
    """Register each ``name: "module:attribute"`` of ``targets`` (imported when first used)."""
    for name, target in targets.items():
        registry.register(name, target)


@hookimpl
def hwplug_register_quant_methods(registry: Any) -> None:
    _register_all(registry, QUANT_METHODS)
    for name, replacement in REMOVED_QUANT_METHODS.items():
        registry.remove(name, replacement)


_CONNECTORS = "hwplug.model_zoo.connectors."
BUILTIN_CONNECTORS = {
    "shared_storage": _CONNECTORS + "shared_storage:SharedStorageConnector",
    "cpu_offload": _CONNECTORS + "cpu_offload:CPUOffloadConnector",
    "p2p": _CONNECTORS + "p2p:P2PConnector",
}


@hookimpl
def hwplug_register_connectors(registry: Any) -> None:
    _register_all(registry, BUILTIN_CONNECTORS)


@hookimpl
def hwplug_register_models(registry: Any) -> None:
    for arch, target in BUILTIN_MODELS.items():
        if arch not in registry:
            registry.register(arch, target)


_PROPOSERS = "hwplug.model_zoo.speculative."
BUILTIN_PROPOSERS = {
    "ngram": _PROPOSERS + "ngram:NgramProposer",
    "draft_model": _PROPOSERS + "draft_model:DraftModelProposer",
}


@hookimpl
def hwplug_register_proposers(registry: Any) -> None:
    _register_all(registry, BUILTIN_PROPOSERS)
