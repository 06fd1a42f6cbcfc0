"""Quantized stacked experts of a :class:`~.moe.FusedMoE` layer: fp8 with block scales and
int8 W8A8, kept quantized in memory and run by ``fp8_moe_experts`` / ``int8_moe_experts``.

The model's quant method says which (:func:`expert_format`): ``fp8`` with
``weight_block_size`` (DeepSeek-V3's own checkpoints: ``weight`` e4m3 and
``weight_scale_inv [rows / br, cols / bc]`` per expert projection) or ``int8`` W8A8
(compressed-tensors: ``weight`` int8 and ``weight_scale [rows, 1]``, activations dynamic
per token). :func:`~.moe.stack_experts` stacks the scales beside the weights, under
transformers' names for stacked quantized experts: ``gate_up_proj_scale_inv`` /
``down_proj_scale_inv`` (fp8) and ``gate_up_proj_scale`` / ``down_proj_scale`` (int8).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwplug.errors import ConfigError, ModelError, UnsupportedError
from hwplug.model_zoo.layers.expert_parallel import held_experts
from hwplug.model_zoo.layers.linear import copy_checked
from hwplug.quantization import QuantMethod

__all__ = ["ScaledExperts", "expert_format"]

#: Expert formats -> (the op that runs them, the stacks' dtype, their scales' suffix).
FORMATS = {"fp8_block": ("fp8_moe_experts", torch.float8_e4m3fn, "_scale_inv"),
           "int8_w8a8": ("int8_moe_experts", torch.int8, "_scale")}
#: What :func:`expert_format` accepts, for its error messages.
SUPPORTED = ("unquantized, gguf, fp8 with block scales (weight_block_size), int8 W8A8 "
             "(per-channel weights, dynamic per-token activations)")


def expert_format(quant_method: QuantMethod) -> str | None:
    """``fp8_block`` or ``int8_w8a8`` for a quant method whose experts stay quantized, None
    for ``unquantized`` and ``gguf`` (the layer's own paths); :class:`UnsupportedError`
    naming the supported formats otherwise."""
    name = quant_method.get_name()
    if name in ("unquantized", "gguf"):
        return None
    scheme = getattr(quant_method, "scheme", None)
    weight = getattr(scheme, "weight", None)
    activation = getattr(scheme, "activation", None)
    if name == "fp8" and weight is not None and weight.granularity == "block":
        return "fp8_block"
    if (name == "int8" and weight is not None and weight.granularity == "channel"
            and activation is not None and activation.granularity == "token"
            and activation.dynamic):
        return "int8_w8a8"
    described = quant_method.describe() if hasattr(quant_method, "describe") else name
    raise UnsupportedError(f"experts of quant method {name!r} are not supported in this form "
                           f"({described}); supported: {SUPPORTED}")


class ScaledExperts(nn.Module):
    """``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]`` in ``fmt``'s dtype with their
    scales (see the module docstring), of the checkpoint's ``num_experts`` those in
    ``held``. fp8 needs ``2I``, ``H`` and ``I`` multiples of the block (gate and up scales
    are stacked tile rows: a partial tile there would straddle the two)."""

    def __init__(self, fmt: str, num_experts: int, hidden_size: int, intermediate_size: int,
                 held: range, block_shape: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.op, dtype, suffix = FORMATS[fmt]
        self.total, self.held = num_experts, held
        self.options: dict[str, Any] = {}
        experts, (rows, cols) = len(held), block_shape or (128, 128)
        shapes = {"gate_up_proj": (2 * intermediate_size, hidden_size),
                  "down_proj": (hidden_size, intermediate_size)}
        if fmt == "fp8_block":
            if hidden_size % rows or hidden_size % cols or intermediate_size % rows or \
                    intermediate_size % cols:
                raise ConfigError(f"fp8 experts with {rows}x{cols} blocks need hidden size "
                                  f"{hidden_size} and expert intermediate size "
                                  f"{intermediate_size} to be multiples of the block")
            self.options["block_shape"] = (rows, cols)
        self.scale_names = {}
        for name, (out, inp) in shapes.items():
            self.register_parameter(name, nn.Parameter(
                torch.empty(experts, out, inp, dtype=dtype), requires_grad=False))
            scale = ((experts, out // rows, inp // cols) if fmt == "fp8_block"
                     else (experts, out))
            self.scale_names[name] = name + suffix
            self.register_parameter(name + suffix, nn.Parameter(
                torch.empty(scale, dtype=torch.float32), requires_grad=False))

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        """Copy this rank's experts of a stacked checkpoint tensor; per-channel scales may
        come as ``[E, rows, 1]``."""
        param = getattr(self, param_name)
        tensor = held_experts(tensor, self.total, self.held)
        if tensor.dim() == param.dim() + 1 and tensor.shape[-1] == 1:
            tensor = tensor.squeeze(-1)
        if tensor.shape != param.shape:
            raise ModelError(f"{param_name}: checkpoint shape {tuple(tensor.shape)}, expected "
                             f"{tuple(param.shape)}")
        copy_checked(param, tensor, param_name)

    def stacks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The op's ``(w13, w13_scale, w2, w2_scale)``."""
        return (self.gate_up_proj, getattr(self, self.scale_names["gate_up_proj"]),
                self.down_proj, getattr(self, self.scale_names["down_proj"]))
