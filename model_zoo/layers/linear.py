"""Linear layers whose weights and matmul come from the model's :class:`QuantMethod`.

:class:`Linear` is one checkpoint matrix; :class:`FusedLinear` concatenates several along
the output dimension (q/k/v, gate/up) so one matmul serves them all, and loads each
checkpoint matrix into its slice by shard name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.errors import ModelError

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext


class Linear(nn.Module):
    """``y [..., output_size] = x [..., input_size] @ W.T (+ b)`` via ``ctx.quant_method``.

    Each parameter loads whole from the checkpoint tensor of the same name.
    """

    def __init__(self, input_size: int, output_size: int, ctx: ModelContext, *,
                 bias: bool = False) -> None:
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.quant_method = ctx.quant_method
        self.quant_method.create_weights(self, input_size, output_size, ctx.dtype, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size}, "
                f"quant={self.quant_method.get_name()}")


class FusedLinear(Linear):
    """Several projections of the same input in one matmul.

    ``output_sizes`` maps shard names to their widths in order (``{"q": 512, "k": 128,
    "v": 128}``); :meth:`split` cuts an output back into those parts (views, no copy).
    Each checkpoint matrix loads into its shard's rows through :meth:`load_weight`; every
    parameter's dim 0 is the concatenated output dim, so per-channel quant parameters
    (scales) load by shard the same way as weights and biases.
    """

    def __init__(self, input_size: int, output_sizes: Mapping[str, int], ctx: ModelContext, *,
                 bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes.values()), ctx, bias=bias)
        self.shard_names = tuple(output_sizes)
        self.output_sizes = list(output_sizes.values())
        offsets = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]
        self.shard_slices = {name: (offset, size) for name, offset, size
                             in zip(self.shard_names, offsets, self.output_sizes, strict=True)}

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``y [..., output_size]`` -> one view per shard, in ``output_sizes`` order."""
        return y.split(self.output_sizes, dim=-1)

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str) -> None:
        """Copy checkpoint ``tensor`` into shard ``shard``'s rows of ``param_name``."""
        offset, size = self.shard_slices[shard]
        copy_checked(getattr(self, param_name).narrow(0, offset, size), tensor,
                     f"{param_name}[{shard}]")


def copy_checked(target: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    """``target.copy_(tensor)`` (casting dtype and device) after checking the shapes match."""
    if target.shape != tensor.shape:
        raise ModelError(f"shape {tuple(tensor.shape)} does not fit {what} "
                         f"{tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(tensor)
