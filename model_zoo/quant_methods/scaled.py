"""fp8 and int8 linear layers: quantized weights with scales, the GEMM through ``ops.scaled_mm``.

A :class:`ScaledLinearMethod` follows its :class:`~.formats.LinearScheme`: it stores
``weight`` in the quantized dtype and its scales as the checkpoint names them; after
loading it lays them out as the ``scaled_mm`` op reads them (``b = weight.T``); at each
call it quantizes the activation (dynamic per tensor, token or token group, or with the
checkpoint's static ``input_scale``) unless the scheme is weight-only, and calls the op,
whose variant the kernel registry chooses. Per-tensor scales of fused layers (q/k/v,
gate/up) are loaded per shard: weight scales then act per output channel (collapsed to one
when all agree), and one input scale, the largest, serves the fused input. On a device that
computes fp8 in the fnuz format (AMD gfx942), e4m3 checkpoints are converted after loading
(the same bytes as e4m3fnuz, scales doubled, as vLLM does) and activations are quantized to
e4m3fnuz.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from hwplug.dtypes import FNUZ_DTYPES, FNUZ_FEATURE, dtype_name, torch_dtype
from hwplug.errors import ConfigError, ModelError
from hwplug.kernel_registry.reference.matmul import expand_scale
from hwplug.model_zoo.kernel_binding import kernels_of
from hwplug.model_zoo.quant_methods.activations import quantize
from hwplug.model_zoo.quant_methods.fnuz import e4m3fn_to_fnuz
from hwplug.model_zoo.quant_methods.formats import (
    LinearScheme,
    compressed_tensors_scheme,
    fp8_scheme,
)
from hwplug.quantization import QuantMethod, ScaleDescriptor


def _fill_rows(param: torch.Tensor, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
    """Weight loader of a per-tensor scale kept per output row: one value fills the rows."""
    if tensor.numel() != 1:
        raise ModelError(f"a per-tensor scale must be one value, got shape {tuple(tensor.shape)}")
    start, count = rows
    with torch.no_grad():
        param.narrow(0, start, count).fill_(float(tensor.reshape(())))


def _load_channels(param: torch.Tensor, tensor: torch.Tensor, rows: tuple[int, int]) -> None:
    """Weight loader of per-channel scales ``[rows, 1]``, stored ``[rows]`` by some."""
    start, count = rows
    if tensor.numel() != count:
        raise ModelError(f"per-channel scales: {tensor.numel()} values for {count} rows")
    with torch.no_grad():
        param.narrow(0, start, count).copy_(tensor.reshape(count, 1))


def _scale_parameter(descriptor: ScaleDescriptor, input_size: int, output_size: int
                     ) -> nn.Parameter:
    """The checkpoint-shaped parameter of a weight's scales (see the module docstring)."""
    if descriptor.granularity == "tensor":
        param = nn.Parameter(torch.empty(output_size, dtype=torch.float32),
                             requires_grad=False)
        param.weight_loader = _fill_rows
    elif descriptor.granularity == "channel":
        param = nn.Parameter(torch.empty(output_size, 1, dtype=torch.float32),
                             requires_grad=False)
        param.weight_loader = _load_channels
    elif descriptor.granularity in ("block", "group"):
        rows, cols = descriptor.group_shape
        if output_size % rows or input_size % cols:
            raise ConfigError(f"{descriptor} weights need sizes that are multiples of the "
                              f"block; this layer is {output_size} x {input_size}")
        param = nn.Parameter(torch.empty(output_size // rows, input_size // cols,
                                         dtype=torch.float32), requires_grad=False)
        param.output_block = rows
    else:
        raise ConfigError(f"weights cannot be scaled per {descriptor.granularity}; supported: "
                          "tensor, channel, block, group")
    return param


class ScaledLinearMethod(QuantMethod):
    """Quantized weights and scales per a :class:`LinearScheme`; ``scaled_mm`` GEMMs.

    A subclass names itself (``_name``), the dtype its weights are stored in
    (``_weight_dtype``) and its scheme for a config that gives none (``_default_scheme``)."""

    gemm_op: ClassVar[str] = "scaled_mm"
    _name: ClassVar[str]
    _weight_dtype: ClassVar[str]

    def __init__(self, scheme: LinearScheme) -> None:
        self.scheme = scheme

    @classmethod
    def get_name(cls) -> str:
        return cls._name

    @staticmethod
    def _default_scheme() -> LinearScheme:
        raise NotImplementedError

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> ScaledLinearMethod:
        scheme = _scheme(quant_config, cls._default_scheme())
        if scheme.weight.dtype != cls._weight_dtype:
            raise ConfigError(f"the {cls._name} method got {scheme.weight} weights")
        return cls(scheme)

    def describe(self) -> str:
        activation = self.scheme.activation or "not quantized"
        return f"{self.get_name()} (weights {self.scheme.weight}, activations {activation})"

    def create_weights(self, layer: torch.nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype, bias: bool) -> None:
        weight, activation = self.scheme.weight, self.scheme.activation
        layer.weight = nn.Parameter(torch.empty(output_size, input_size,
                                                dtype=torch_dtype(weight.dtype)),
                                    requires_grad=False)
        layer.register_parameter(self.scheme.weight_scale_name,
                                 _scale_parameter(weight, input_size, output_size))
        if activation is not None and not activation.dynamic:
            layer.input_scale = nn.Parameter(torch.empty(output_size, dtype=torch.float32),
                                             requires_grad=False)
            layer.input_scale.weight_loader = _fill_rows
        layer.register_parameter("bias", nn.Parameter(
            torch.empty(output_size, dtype=params_dtype), requires_grad=False) if bias else None)
        plan = kernels_of(layer)
        layer.fnuz = self._converts_to_fnuz(plan)
        if layer.fnuz and activation is not None:
            activation = dataclasses.replace(activation, dtype=FNUZ_DTYPES[0])
        layer.activation = activation
        # scaled_mm dispatches on its activation: quantized here, or the model's for W8A16
        layer.gemm_kernel = plan.bind(
            "scaled_mm", activation.dtype if activation is not None else dtype_name(params_dtype))

    def _converts_to_fnuz(self, plan: Any) -> bool:
        """Whether OCP e4m3 weights become e4m3fnuz here: the platform the layer's kernels
        are planned for computes fp8 in fnuz (:data:`~hwplug.dtypes.FNUZ_FEATURE`)."""
        platform = getattr(plan, "platform", None)
        return (self.scheme.weight.dtype == "fp8_e4m3" and platform is not None
                and FNUZ_FEATURE in platform.facts.features)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Lay the scales out as ``scaled_mm`` reads them: ``layer.scale_b`` (scalar,
        ``[1, N]`` or ``[K / bk, N / bn]``) and ``layer.scale_a`` (the static input scale,
        or 1 for weight-only; None when dynamic). Where the device computes in fnuz, the
        e4m3 weights are converted first and their scales doubled (:mod:`.fnuz`)."""
        scale = getattr(layer, self.scheme.weight_scale_name).detach().float()
        input_scale = getattr(layer, "input_scale", None)
        if layer.fnuz:
            weight, scale, input_scale = e4m3fn_to_fnuz(
                layer.weight.detach(), scale,
                None if input_scale is None else input_scale.detach().float())
            layer.weight = nn.Parameter(weight, requires_grad=False)
        if self.scheme.weight.granularity == "tensor":
            scale = scale[0] if bool((scale == scale[0]).all()) else scale[:, None]
        layer.register_buffer("scale_b", scale.t() if scale.dim() else scale, persistent=False)
        activation, scale_a = self.scheme.activation, None
        if activation is None:
            scale_a = torch.ones((), device=scale.device)
        elif not activation.dynamic:
            scale_a = input_scale.detach().float().amax()
        layer.register_buffer("scale_a", scale_a, persistent=False)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        activation = layer.activation
        if activation is None:
            a, scale_a = rows, layer.scale_a
        else:
            a, scale_a = quantize(rows, activation, layer.scale_a)
        out = layer.gemm_kernel(a, layer.weight.t(), scale_a, layer.scale_b, x.dtype, layer.bias)
        return out.view(*x.shape[:-1], out.shape[-1])

    def activation_quantization(self) -> ScaleDescriptor | None:
        return self.scheme.activation

    def dequantize(self, layer: torch.nn.Module) -> torch.Tensor:
        b = layer.weight.t()
        return (b.float() * expand_scale(layer.scale_b, b.shape)).t()


def _scheme(quant_config: dict[str, Any] | None, default: LinearScheme) -> LinearScheme:
    """The scheme of a checkpoint config (``{"quant_method": name}`` alone: ``default``)."""
    config = dict(quant_config or {})
    if config.get("quant_method") == "compressed-tensors":
        return compressed_tensors_scheme(config)
    if set(config) <= {"quant_method"}:
        return default
    return fp8_scheme(config)


class Fp8LinearMethod(ScaledLinearMethod):
    """W8A8 fp8 (e4m3): per-tensor, per-channel or 128x128-block weight scales; dynamic or
    static activations. ``from_config`` reads ``quant_method: fp8`` and compressed-tensors
    float configs; ``{"quant_method": "fp8"}`` alone means per-tensor, dynamic."""

    #: fp8 tensor cores: Ada / Hopper. CPUs (no capability) run the reference.
    min_capability: ClassVar[str | None] = "8.9"
    _name: ClassVar[str] = "fp8"
    _weight_dtype: ClassVar[str] = "fp8_e4m3"

    @staticmethod
    def _default_scheme() -> LinearScheme:
        return fp8_scheme({})


class Int8LinearMethod(ScaledLinearMethod):
    """int8 weights with per-channel (or per-tensor, per-group) scales: W8A8 with dynamic
    per-token activations, or weight-only (W8A16). ``from_config`` reads compressed-tensors
    int configs; ``{"quant_method": "int8"}`` alone means W8A8, per channel and per token."""

    #: int8 tensor cores: Turing and newer. CPUs (no capability) are gated by their facts.
    min_capability: ClassVar[str | None] = "7.5"
    _name: ClassVar[str] = "int8"
    _weight_dtype: ClassVar[str] = "int8"

    @staticmethod
    def _default_scheme() -> LinearScheme:
        return LinearScheme(ScaleDescriptor("int8", "channel"),
                            ScaleDescriptor("int8", "token", dynamic=True))
