"""llama.cpp's stacked expert tensors in a GGUF file: their transformers names, and kept in
their blocks.

A mixture-of-experts GGUF stores each layer's experts as three 3-D tensors,
``blk.<i>.ffn_gate_exps``, ``ffn_up_exps`` ``[E, I, H]`` and ``ffn_down_exps`` ``[E, H, I]``
(as ggml lists dims: reversed). transformers holds them as ``mlp.experts.gate_up_proj``
(gate rows then up rows of each expert) and ``mlp.experts.down_proj``; its
``Qwen2MoeTensorProcessor`` joins gate and up when dequantizing. Kept in blocks
(:class:`ExpertBlocks`), ``down_proj.qweight`` (``uint8 [E, H, row_bytes]``) is the file's
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

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.mapped import MappedTensor

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor

    from hwplug.model_zoo.loaders.gguf_file import ConvertedTensors

_GGUF = re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<part>gate|up|down)_exps\.weight$")
_PARAMETER = re.compile(r"^model\.layers\.(?P<layer>\d+)\.mlp\.experts\."
                        r"(?P<stack>gate_up_proj|down_proj)$")


def complete_config(config: Any, reader: GGUFReader) -> None:
    """Set ``config.moe_intermediate_size`` from ``<arch>.expert_feed_forward_length``,
    which transformers' GGUF config reader leaves at the class default."""
    architecture = reader.fields["general.architecture"].contents()
    field = reader.fields.get(f"{architecture}.expert_feed_forward_length")
    if field is not None and hasattr(config, "moe_intermediate_size"):
        config.moe_intermediate_size = int(field.contents())


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

    def take(self, tensor: ReaderTensor, names: dict[str, str],
             converted: ConvertedTensors) -> bool:
        """Convert ``tensor`` into ``converted`` if it is a stacked expert tensor of a
        parameter ``names`` maps; whether it was one."""
        match = _GGUF.match(tensor.name)
        parameter = names.get(tensor.name.removesuffix(".weight")) if match else None
        if parameter is None:
            return False
        converted.written[f"{parameter}.qweight_type"] = torch.tensor(
            [int(tensor.tensor_type)], dtype=torch.int32)
        if match["part"] == "down":
            converted.in_place[f"{parameter}.qweight"] = MappedTensor(
                int(tensor.data_offset), "uint8", _blocks(tensor).shape)
            return True
        other = self.pending.pop(parameter, None)
        if other is None:
            self.pending[parameter] = (match["part"], tensor)
            return True
        gate, up = (other[1], tensor) if other[0] == "gate" else (tensor, other[1])
        if gate.tensor_type != up.tensor_type:
            raise ModelError(f"{gate.name} is {gate.tensor_type.name} but {up.name} is "
                             f"{up.tensor_type.name}: hwplug keeps an expert's gate and up "
                             "rows in one type")
        qweight = f"{parameter}.qweight"
        converted.repacked[qweight] = np.concatenate([_blocks(gate), _blocks(up)], axis=1)
        converted.copied[qweight] = "the experts' gate and up blocks are joined per expert"
        return True

    def check_done(self) -> None:
        """Raise :class:`ModelError` naming an expert tensor whose partner never came."""
        for parameter, (part, tensor) in self.pending.items():
            raise ModelError(f"{tensor.name} has no {'up' if part == 'gate' else 'gate'} "
                             f"partner for {parameter}")


def _blocks(tensor: ReaderTensor) -> np.ndarray:
    """``uint8 [E, rows, row_bytes]``: a 3-D tensor's blocks (or float values) as bytes."""
    data = np.ascontiguousarray(tensor.data)
    return data.view(np.uint8).reshape(data.shape[0], data.shape[1], -1)
