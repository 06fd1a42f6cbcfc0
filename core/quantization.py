"""``QuantMethod``: how a linear layer stores its weights and computes ``x @ W.T``.

A quant method is chosen per checkpoint from its quantization config (``None`` means
``"unquantized"``). The model's linear layers delegate weight creation, post-load
processing and the matmul to it; the matmul kernels come from the kernel registry.
Scales are described by one small type, :class:`ScaleDescriptor`, wherever they occur
(weights, activations, KV caches).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hwplug.errors import ConfigError, UnsupportedError
from hwplug.interface import StrictInterface
from hwplug.requirements import Requirements

if TYPE_CHECKING:
    import torch

__all__ = ["GRANULARITIES", "QuantMethod", "ScaleDescriptor"]

#: How many values share one scale: the whole tensor, one output channel (row), one token
#: (row of an activation), or a group / block of ``group_shape`` elements.
Granularity = Literal["tensor", "channel", "token", "group", "block"]
GRANULARITIES: tuple[str, ...] = ("tensor", "channel", "token", "group", "block")


@dataclass(frozen=True)
class ScaleDescriptor:
    """How a quantized tensor is scaled: ``real = stored * scale``.

    ``dtype`` is the stored dtype (``"fp8_e4m3"``, ``"int8"``, ...); ``dynamic`` scales are
    computed from each tensor as it arrives (activations), static ones are loaded with the
    checkpoint. ``group_shape`` is required for ``"group"`` (``(1, 128)``: 128 consecutive
    input elements) and ``"block"`` (``(128, 128)``) and absent otherwise.
    """

    dtype: str
    granularity: Granularity = "tensor"
    dynamic: bool = False
    group_shape: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"scale granularity {self.granularity!r} is not valid; choose "
                              f"one of: {', '.join(GRANULARITIES)}")
        grouped = self.granularity in ("group", "block")
        if grouped and not (self.group_shape and all(n > 0 for n in self.group_shape)):
            raise ConfigError(f"{self.granularity} scales need a positive group_shape, got "
                              f"{self.group_shape!r}")
        if not grouped and self.group_shape is not None:
            raise ConfigError(f"{self.granularity} scales take no group_shape, got "
                              f"{self.group_shape!r}")

    def __str__(self) -> str:
        shape = f" {'x'.join(map(str, self.group_shape))}" if self.group_shape else ""
        kind = "dynamic" if self.dynamic else "static"
        return f"{self.dtype} per-{self.granularity}{shape} ({kind})"


class QuantMethod(StrictInterface, abc.ABC):
    """One quantization scheme. Instances are created per checkpoint via :meth:`from_config`."""

    _interface_root = True

    #: Activation dtypes the method computes in.
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    #: Minimum device capability (enforced where the device reports one), or None.
    min_capability: ClassVar[str | None] = None
    #: The kernel-registry op :meth:`apply` computes with (reported as what serves it).
    gemm_op: ClassVar[str] = "linear"
    #: The op :meth:`embed` looks rows up with (dispatched on int64 ids): a vocabulary table
    #: binds it from the model's kernel plan as ``layer.embed_kernel``.
    embed_op: ClassVar[str] = "embedding"
    #: Whether the embedding and LM head tables are stored by this method too (it then
    #: implements :meth:`embed`); otherwise they stay unquantized in the model dtype.
    quantizes_vocab: ClassVar[bool] = False

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The registered name, matching ``quant_method`` in a checkpoint's config."""

    @classmethod
    def requirements(cls) -> Requirements:
        """Where the method runs: its :attr:`supported_dtypes` and :attr:`min_capability`
        (override to add platforms, device features or packages)."""
        return Requirements(dtypes=cls.supported_dtypes, min_capability=cls.min_capability)

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

    def embed(self, layer: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids [T]`` of the table ``layer`` holds (created by :meth:`create_weights`
        with the table's ``dim`` inputs and ``num_rows`` outputs) -> ``[T, dim]``, any float
        dtype. Required where :attr:`quantizes_vocab` is set."""
        raise UnsupportedError(f"quant method {self.get_name()!r} does not store embedding "
                               "tables")

    def example_checkpoint(self, input_size: int, output_size: int,
                           generator: torch.Generator) -> dict[str, torch.Tensor] | None:
        """Random tensors, by parameter name, that a checkpoint of this method could hold for
        a layer of this shape (the conformance kit loads them through the parameters'
        ``weight_loader`` where they have one). None, the default: every parameter random in
        its own dtype is a valid layer. Raise :class:`~hwplug.errors.UnsupportedError` for
        a shape the method cannot store."""
        return None

    def describe(self) -> str:
        """The method and its scheme in words, for logs and reports."""
        return self.get_name()

    def activation_quantization(self) -> ScaleDescriptor | None:
        """How :meth:`apply` quantizes activations before its matmul (None: it does not).
        Checks against ``x @ dequantize(layer).T`` allow that format's rounding."""
        return None

    def dequantize(self, layer: torch.nn.Module) -> torch.Tensor:
        """The weight ``apply`` multiplies by, as float32 ``[output_size, input_size]``.

        Valid after :meth:`process_weights_after_loading`. It is the oracle of the
        conformance kit, which checks ``apply(layer, x)`` against
        ``x @ dequantize(layer).T + bias``; a method without it cannot be checked.
        """
        raise UnsupportedError(f"quant method {self.get_name()!r} does not implement "
                               "dequantize(layer), so it cannot be checked against x @ W.T")
