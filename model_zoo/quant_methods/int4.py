"""int4 weight-only linear layers (W4A16): compressed-tensors ``pack-quantized`` weights, the
GEMM through ``ops.int4_linear``.

The format, as llm-compressor writes it (its ``W4A16`` scheme): per linear layer
``weight_packed`` (int32 ``[N, K / 8]``: eight 4-bit codes per int32, the first in the
lowest bits, each the value plus 8), ``weight_scale`` (``[N, K / group]``, in the model's
dtype) and ``weight_shape`` (``[N, K]``); symmetric (no zero point), one scale per output
row and group of ``group_size`` inputs (strategy ``group``) or per row (``channel``).
Read as bytes on a little-endian machine, ``weight_packed`` is exactly the ``int4_linear``
op's ``qweight`` (``uint8 [N, K / 2]``), so loading copies nothing twice: after loading,
``layer.qweight`` is that byte view and ``layer.scales`` the float32 scales.

Refused, with a typed error naming what is supported: other bit widths and types,
asymmetric weights, ``actorder: group`` (see :mod:`.formats`), strategies other than
group and channel, quantized activations, and other compressed-tensors formats.
``{"quant_method": "int4"}`` alone means groups of 128, llm-compressor's default.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hwplug.dtypes import dtype_name
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry.reference.int4 import dequantize_int4
from hwplug.model_zoo.kernel_binding import kernels_of
from hwplug.model_zoo.quant_methods.formats import (
    LinearScheme,
    compressed_tensors_scheme,
    config_groups,
)
from hwplug.quantization import QuantMethod, ScaleDescriptor

#: compressed-tensors' name of this packing.
PACK_QUANTIZED = "pack-quantized"
#: int4 codes per stored int32.
CODES_PER_INT32 = 8
DEFAULT_GROUP_SIZE = 128
STRATEGIES = ("group", "channel")


def _accept_shape(param: torch.Tensor, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
    """Weight loader of ``weight_shape``: the format's record of the unpacked ``[N, K]``,
    which ``weight_packed``'s shape already fixes (K is a multiple of 8, so nothing was
    padded); nothing to keep."""


def _packed_format(config: dict[str, Any]) -> str | None:
    """The compressed-tensors format of a config: its group's, else the top-level one."""
    groups = list(config_groups(config).values())
    return (groups[0].get("format") if groups else None) or config.get("format")


def int4_scheme(quant_config: dict[str, Any] | None) -> LinearScheme:
    """The W4A16 scheme of a checkpoint config (see the module docstring)."""
    config = dict(quant_config or {})
    if set(config) <= {"quant_method"}:
        return LinearScheme(ScaleDescriptor("int4", "group", group_shape=(1, DEFAULT_GROUP_SIZE)),
                            None)
    if config.get("quant_method") != "compressed-tensors":
        raise UnsupportedError(f"the int4 method reads compressed-tensors checkpoints, not "
                               f"quant_method {config.get('quant_method')!r}")
    fmt = _packed_format(config)
    if fmt != PACK_QUANTIZED:
        raise UnsupportedError(f"compressed-tensors format {fmt!r} is not supported for int4 "
                               f"weights; supported: {PACK_QUANTIZED!r}")
    scheme = compressed_tensors_scheme(config)
    if scheme.weight.dtype != "int4":
        raise ConfigError(f"the int4 method got {scheme.weight} weights")
    if scheme.weight.granularity not in STRATEGIES or scheme.weight.dynamic:
        raise UnsupportedError(f"int4 weights scaled {scheme.weight} are not supported; "
                               f"supported strategies: {', '.join(STRATEGIES)} (static)")
    if scheme.activation is not None:
        raise UnsupportedError(f"int4 weights with {scheme.activation} activations are not "
                               "supported; supported: weight-only (W4A16, no "
                               "input_activations)")
    return scheme


class Int4LinearMethod(QuantMethod):
    """Group-wise (or per-row) symmetric int4 weights, activations in the model dtype;
    the GEMM is the ``int4_linear`` op (KleidiAI on Arm via hwplug-cpu-arm, else the
    reference, which dequantizes on every call)."""

    gemm_op: ClassVar[str] = "int4_linear"

    def __init__(self, scheme: LinearScheme) -> None:
        self.scheme = scheme

    @classmethod
    def get_name(cls) -> str:
        return "int4"

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> Int4LinearMethod:
        return cls(int4_scheme(quant_config))

    def describe(self) -> str:
        return (f"int4 (weights {self.scheme.weight}, activations in the model dtype; "
                "int8 per row inside KleidiAI's kernels)")

    def _group_size(self, input_size: int) -> int:
        weight = self.scheme.weight
        return input_size if weight.granularity == "channel" else weight.group_shape[-1]

    def create_weights(self, layer: torch.nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype, bias: bool) -> None:
        group = self._group_size(input_size)
        if input_size % CODES_PER_INT32 or input_size % group:
            raise ConfigError(f"int4 weights need inputs that are a multiple of "
                              f"{CODES_PER_INT32} and of the group size {group}; this layer "
                              f"has {input_size}")
        layer.weight_packed = nn.Parameter(torch.empty(
            output_size, input_size // CODES_PER_INT32, dtype=torch.int32), requires_grad=False)
        layer.weight_scale = nn.Parameter(torch.empty(output_size, input_size // group,
                                                      dtype=torch.float32), requires_grad=False)
        layer.weight_shape = nn.Parameter(torch.empty(0, dtype=torch.int64),
                                          requires_grad=False)
        layer.weight_shape.weight_loader = _accept_shape
        layer.register_parameter("bias", nn.Parameter(
            torch.empty(output_size, dtype=params_dtype), requires_grad=False) if bias else None)
        layer.gemm_kernel = kernels_of(layer).bind("int4_linear", dtype_name(params_dtype))

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """``layer.qweight``: ``weight_packed`` as the op's ``uint8 [N, K / 2]`` (a view,
        little-endian); ``layer.scales``: float32 ``[N, K / group]``."""
        layer.register_buffer("qweight", layer.weight_packed.detach().view(torch.uint8),
                              persistent=False)
        layer.register_buffer("scales", layer.weight_scale.detach().float().contiguous(),
                              persistent=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.gemm_kernel(x, layer.qweight, layer.scales, layer.bias)

    def dequantize(self, layer: torch.nn.Module) -> torch.Tensor:
        return dequantize_int4(layer.qweight, layer.scales)
