"""``UnquantizedLinearMethod``: plain ``weight [out, in]`` (+ ``bias [out]``), the
registry's ``linear`` op (``embedding`` for vocabulary tables), bound from the model's
kernel plan.

Registered as ``"unquantized"`` by :mod:`hwplug.model_zoo.plugin`; it is the quant method of
every checkpoint without a ``quantization_config``.
"""

from __future__ import annotations

import torch

from hwplug.dtypes import dtype_name
from hwplug.model_zoo.kernel_binding import kernels_of
from hwplug.quantization import QuantMethod


class UnquantizedLinearMethod(QuantMethod):
    """Weights stored as given in the model dtype; the matmul is the ``linear`` op."""

    @classmethod
    def get_name(cls) -> str:
        return "unquantized"

    def create_weights(self, layer: torch.nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype, bias: bool) -> None:
        layer.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=params_dtype),
                                          requires_grad=False)
        layer.register_parameter("bias", torch.nn.Parameter(
            torch.empty(output_size, dtype=params_dtype), requires_grad=False) if bias else None)
        layer.gemm_kernel = kernels_of(layer).bind("linear", dtype_name(params_dtype))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return layer.gemm_kernel(x, layer.weight, layer.bias)

    def embed(self, layer: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return layer.embed_kernel(ids, layer.weight)

    def dequantize(self, layer: torch.nn.Module) -> torch.Tensor:
        return layer.weight.float()
