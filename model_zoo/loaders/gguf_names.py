"""GGUF tensor names in transformers' naming, and the transformers model a config builds."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.gguf_deepseek import deepseek_names
from hwplug.model_zoo.loaders.gguf_experts import expert_names

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def gguf_to_transformers_names(architecture: str, parameter_names: Iterable[str],
                               num_layers: int) -> dict[str, str]:
    """``{gguf tensor name: transformers parameter name}`` for a model of the GGUF
    ``architecture`` (e.g. ``"llama"``) with these parameters."""
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ModelError(f"the installed gguf package does not know the GGUF architecture "
                         f"{architecture!r}")
    name_map = get_tensor_name_map(arch, num_layers)
    parameter_names = list(parameter_names)
    mapping = expert_names(parameter_names) | deepseek_names(parameter_names)
    for parameter in parameter_names:
        gguf_name = name_map.get_name(parameter, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None:
            mapping[gguf_name] = parameter
    return mapping


def causal_lm_skeleton(config: PretrainedConfig, path: Path) -> tuple[str, list[str]]:
    """The name and parameter names of ``config``'s transformers causal-LM class, built on
    the meta device (no memory used)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # an unknown model type, or sizes transformers rejects
        raise ModelError(f"{path}: transformers has no causal-LM class for model type "
                         f"{config.model_type!r}: {exc}") from exc
    return type(model).__name__, list(model.state_dict())
