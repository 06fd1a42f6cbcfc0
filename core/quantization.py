"""``QuantMethod``: how a linear layer stores its weights and computes ``x @ W.T``.

A quant method is chosen per checkpoint from its quantization config (``None`` means
``"unquantized"``). The model's linear layers delegate weight creation, post-load
processing and the matmul to it; the matmul kernels come from the kernel registry.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug.interface import StrictInterface

if TYPE_CHECKING:
    import torch


class QuantMethod(StrictInterface, abc.ABC):
    """One quantization scheme. Instances are created per checkpoint via :meth:`from_config`."""

    _interface_root = True

    #: Activation dtypes the method computes in.
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    #: Minimum device capability, or None.
    min_capability: ClassVar[str | None] = None

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The registered name, matching ``quant_method`` in a checkpoint's config."""

    @classmethod
    def from_config(cls, quant_config: dict[str, Any] | None) -> QuantMethod:
        """Build from a checkpoint's ``quantization_config`` (None for unquantized)."""
        return cls()

    @abc.abstractmethod
    def create_weights(self, layer: torch.nn.Module, input_size: int, output_size: int,
                       params_dtype: torch.dtype, bias: bool) -> None:
        """Create the layer's parameters (at least ``weight``; ``bias`` when asked)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        """Repack or quantize loaded weights in place (default: nothing to do)."""

    @abc.abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x [..., input_size]`` -> ``[..., output_size]`` (bias included)."""
