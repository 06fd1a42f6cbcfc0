"""hwplug hooks of the model zoo: its architectures and its quant methods.

Loaded like any plugin (entry point ``hwplug-models`` of group ``hwplug.plugins`` in
hwplug's own distribution). Architectures registered in code before discovery keep their
registration.
"""

from __future__ import annotations

from typing import Any

from hwplug.hookspecs import hookimpl

hwplug_api_version = ">=1,<2"
hwplug_order = -100  # before every third-party plugin, so they may override

_MODELS = "hwplug.model_zoo.models."
BUILTIN_MODELS = {
    "LlamaForCausalLM": _MODELS + "llama:LlamaForCausalLM",
    "MistralForCausalLM": _MODELS + "llama:LlamaForCausalLM",
    "Qwen2ForCausalLM": _MODELS + "llama:LlamaForCausalLM",
    "Qwen3ForCausalLM": _MODELS + "qwen3:Qwen3ForCausalLM",
    "BertModel": _MODELS + "bert:BertModel",
}


@hookimpl
def hwplug_register_quant_methods(registry: Any) -> None:
    registry.register("unquantized",
                      "hwplug.model_zoo.quant_methods.unquantized:UnquantizedLinearMethod")


@hookimpl
def hwplug_register_models(registry: Any) -> None:
    for arch, target in BUILTIN_MODELS.items():
        if arch not in registry:
            registry.register(arch, target)
