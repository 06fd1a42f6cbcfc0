"""llama.cpp's stacked expert tensors in a GGUF file: their transformers names, and kept in
their blocks.

A mixture-of-experts GGUF stores each layer's experts as three 3-D tensors,
``blk.<i>.ffn_gate_exps``, ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]``
(as ggml lists dims: reversed). transformers holds them as ``mlp.experts.gate_up_proj``
(gate rows then up rows of each expert) and ``mlp.experts.down_proj``; its
``Qwen2MoeTensorProcessor`` joins gate and up when dequantizing, its Llama one (llama.cpp's
Mixtral) does not, so :class:`ExpertBlocks` converts them in every case: dequantized, the
two stacks in float32; kept in blocks, ``down_proj.qweight`` (``uint8 [E, H, row_bytes]``) is the file's
own bytes, used in place, and ``gate_up_proj.qweight`` (``uint8 [E, 2I, row_bytes]``) the
two tensors' blocks joined per expert (repacked: one copy), each with its
``qweight_type``; gate and up must share a type.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gguf.quants import dequantize

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.mapped import MappedTensor

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

    from hwplug.model_zoo.loaders.gguf_file import ConvertedTensors

_GGUF = re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<part>gate|up|down)_exps\.weight$")
_PARAMETER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.mlp\.experts\."
                        r"(?P<stack>gate_up_proj|down_proj)$")


def complete_config(config: Any, reader: GGUFReader) -> Any:
    """``config`` (transformers' reading of the file's metadata) completed for a mixture of
    experts: ``moe_intermediate_size`` from ``<arch>.expert_feed_forward_length`` (left at
    the class default by transformers), and a ``llama`` file with ``llama.expert_count``
    (llama.cpp's Mixtral) as a ``MixtralConfig`` (transformers reads it as a dense
    Llama). Other configs are returned as they are."""
    architecture = reader.fields["general.architecture"].contents()

    def field(key: str) -> Any:
        found = reader.fields.get(f"{architecture}.{key}")
        return None if found is None else found.contents()

    if field("expert_feed_forward_length") is not None and \
            hasattr(config, "moe_intermediate_size"):
        config.moe_intermediate_size = int(field("expert_feed_forward_length"))
    if architecture != "llama" or not field("expert_count"):
        return config
    from transformers import MixtralConfig

    values = {key: value for key, value in config.to_dict().items()
              if key not in ("model_type", "architectures", "transformers_version")}
    return MixtralConfig(**{**values, "num_local_experts": int(field("expert_count")),
                            "num_experts_per_tok": int(field("expert_used_count")),
                            "architectures": ["MixtralForCausalLM"]})


def expert_names(parameter_names: Iterable[str]) -> dict[str, str]:
    """``{gguf tensor name (no .weight): transformers parameter}`` of the stacked experts:
    ``ffn_gate_exps`` and ``ffn_up_exps`` both name ``gate_up_proj``."""
    mapping = {}
    for name in parameter_names:
        if (match := _PARAMETER.match(name)) is None:
            continue
        parts = ("gate", "up") if match["stack"] == "gate_up_proj" else ("down",)
        for part in parts:
            mapping[f"blk.{match['layer']}.ffn_{part}_exps"] = name
    return mapping


class ExpertBlocks:
    """Kept-in-blocks conversion of the stacked expert tensors (see the module docstring);
    gate and up wait for each other."""

    def __init__(self) -> None:
        self.pending: dict[str, tuple[str, ReaderTensor]] = {}

    def take(self, tensor: ReaderTensor, names: dict[str, str], converted: ConvertedTensors,
             dequantize_all: bool) -> bool:
        """Convert ``tensor`` into ``converted`` (dequantized to float32 when
        ``dequantize_all``) if it is a stacked expert tensor of a parameter ``names``
        maps; whether it was one."""
        match = _GGUF.match(tensor.name)
        parameter = names.get(tensor.name.removesuffix(".weight")) if match else None
        if parameter is None:
            return False
        if match["part"] == "down":
            self._write(parameter, [tensor], converted, dequantize_all)
            return True
        other = self.pending.pop(parameter, None)
        if other is None:
            self.pending[parameter] = (match["part"], tensor)
            return True
        gate, up = (other[1], tensor) if other[0] == "gate" else (tensor, other[1])
        if gate.tensor_type != up.tensor_type and not dequantize_all:
            raise ModelError(f"{gate.name} is {gate.tensor_type.name} but {up.name} is "
                             f"{up.tensor_type.name}: hwplug keeps an expert's gate and up "
                             "rows in one type")
        self._write(parameter, [gate, up], converted, dequantize_all)
        return True

    @staticmethod
    def _write(parameter: str, tensors: list[ReaderTensor], converted: ConvertedTensors,
               dequantize_all: bool) -> None:
        """``tensors`` (down; or gate and up, joined per expert) as ``parameter``."""
        if dequantize_all:
            converted.written[parameter] = torch.from_numpy(np.concatenate(
                [dequantize(t.data, t.tensor_type).astype(np.float32) for t in tensors], axis=1))
            return
        converted.written[f"{parameter}.qweight_type"] = torch.tensor(
            [int(tensors[0].tensor_type)], dtype=torch.int32)
        qweight = f"{parameter}.qweight"
        if len(tensors) == 1:
            converted.in_place[qweight] = MappedTensor(int(tensors[0].data_offset), "uint8",
                                                       _blocks(tensors[0]).shape)
            return
        converted.repacked[qweight] = np.concatenate([_blocks(t) for t in tensors], axis=1)
        converted.copied[qweight] = "the experts' gate and up blocks are joined per expert"

    def check_done(self) -> None:
        """Raise :class:`ModelError` naming an expert tensor whose partner never came."""
        for parameter, (part, tensor) in self.pending.items():
            raise ModelError(f"{tensor.name} has no {'up' if part == 'gate' else 'gate'} "
                             f"partner for {parameter}")


def _blocks(tensor: ReaderTensor) -> np.ndarray:
    """``uint8 [E, rows, row_bytes]``: a 3-D tensor's blocks (or float values) as bytes."""
    data = np.ascontiguousarray(tensor.data)
    return data.view(np.uint8).reshape(data.shape[0], data.shape[1], -1)
