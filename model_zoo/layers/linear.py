"""Linear layers whose weights and matmul come from the model's :class:`QuantMethod`.

:class:`Linear` is one checkpoint matrix; :class:`FusedLinear` concatenates several along
the output dimension (q/k/v, gate/up) so one matmul serves them all, and loads each
checkpoint matrix into its rows by shard name. Under tensor parallelism
(:mod:`hwplug.model_zoo.parallel`) a ``"column"`` layer holds a share of the output rows
and a ``"row"`` layer a share of the input columns, all-reducing its output; each loads
only its slice of the checkpoint tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

PARALLEL_MODES = (None, "column", "row")
#: (checkpoint dim, first index, count, full size): the share of a dim one rank loads.
Source = tuple[int, int, int, int]


class Linear(nn.Module):
    """``y [..., output_size] = x [..., input_size] @ W.T (+ b)`` via ``ctx.quant_method``.

    ``parallel`` is None (every rank holds the whole matrix), ``"column"`` or ``"row"``;
    ``input_size`` and ``output_size`` are then this rank's share. Parameters load from the
    checkpoint tensors of the same name through :meth:`load_weight`.
    """

    def __init__(self, input_size: int, output_size: int, ctx: ModelContext, *,
                 bias: bool = False, parallel: str | None = None) -> None:
        super().__init__()
        if parallel not in PARALLEL_MODES:
            raise ConfigError(f"parallel {parallel!r} is not valid; choose one of: "
                              f"{', '.join(map(str, PARALLEL_MODES))}")
        self.parallel, self.tp = parallel, ctx.parallel
        #: (checkpoint dim, first index, count, full size) of the dimension this rank
        #: holds a share of, or None.
        self.source: Source | None = None
        if parallel == "column" and self.tp.size > 1:
            self.source = (0, *self.tp.share(output_size, "output rows"), output_size)
            output_size = self.source[2]
        elif parallel == "row" and self.tp.size > 1:
            self.source = (1, *self.tp.share(input_size, "input columns"), input_size)
            input_size = self.source[2]
        self.input_size, self.output_size = input_size, output_size
        self.kernels = ctx.kernels  # the quant method binds its GEMM from it
        self.quant_method = ctx.quant_method
        self.quant_method.create_weights(self, input_size, output_size, ctx.dtype, bias)
        if bias and parallel == "row" and self.tp.rank:
            nn.init.zeros_(self.bias)  # rank 0 adds the bias, once, before the all-reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x)
        return self.tp.all_reduce(y) if self.parallel == "row" else y

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        """Load this rank's slice of checkpoint ``tensor`` into the output rows of ``shard``
        (all rows: None) of parameter ``param_name``.

        A parameter its quant method gave a ``weight_loader(param, tensor, rows)`` attribute
        loads itself (``rows`` = first output row, row count). Otherwise a parameter whose
        dim 0 runs over output rows (weights, biases, per-channel scales; with an
        ``output_block`` attribute, one entry per block of that many rows) takes the rows'
        slice, and any other is copied whole.
        """
        if param_name == "bias" and self.parallel == "row" and self.tp.rank:
            return
        load_rows(self, param_name, tensor, self.source_of(shard), self.rows(shard), shard)

    def rows(self, shard: str | None) -> tuple[int, int]:
        """``(first output row, row count)`` of ``shard`` (None: every row)."""
        return 0, self.output_size

    def source_of(self, shard: str | None) -> Source | None:
        """The checkpoint slice of ``shard`` this rank loads (see :attr:`source`)."""
        return self.source

    def extra_repr(self) -> str:
        split = f", parallel={self.parallel}" if self.source else ""
        return (f"in={self.input_size}, out={self.output_size}, "
                f"quant={self.quant_method.get_name()}{split}")


class FusedLinear(Linear):
    """Several projections of the same input in one matmul.

    ``output_sizes`` maps shard names to the widths this rank holds, in order
    (``{"q": 512, "k": 128, "v": 128}``); :meth:`split` cuts an output back into those
    parts (views, no copy). ``source_rows`` gives, per shard, the checkpoint rows
    ``(first, count, full)`` this rank loads of the shard's ``full`` rows (default: all of
    them; under tensor parallelism the model passes each rank's share). Each checkpoint tensor loads into its shard's output
    rows through :meth:`~Linear.load_weight` (weights, biases and scales alike).
    """

    def __init__(self, input_size: int, output_sizes: Mapping[str, int], ctx: ModelContext, *,
                 bias: bool = False,
                 source_rows: Mapping[str, tuple[int, int, int]] | None = None) -> None:
        super().__init__(input_size, sum(output_sizes.values()), ctx, bias=bias)
        self.shard_names = tuple(output_sizes)
        self.output_sizes = list(output_sizes.values())
        offsets = [sum(self.output_sizes[:i]) for i in range(len(self.output_sizes))]
        self.shard_slices = {name: (offset, size) for name, offset, size
                             in zip(self.shard_names, offsets, self.output_sizes, strict=True)}
        self.source_rows = dict(source_rows or {})

    def split(self, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``y [..., output_size]`` -> one view per shard, in ``output_sizes`` order."""
        return y.split(self.output_sizes, dim=-1)

    def rows(self, shard: str | None) -> tuple[int, int]:
        return self.shard_slices[shard] if shard is not None else (0, self.output_size)

    def source_of(self, shard: str | None) -> Source | None:
        rows = self.source_rows.get(shard) if shard is not None else None
        return (0, *rows) if rows else None


def load_rows(layer: nn.Module, param_name: str, tensor: torch.Tensor,
              source: Source | None, rows: tuple[int, int], shard: str | None = None) -> None:
    """Load the ``source`` slice of checkpoint ``tensor`` into output rows ``rows``
    (``(first, count)``) of ``layer``'s parameter ``param_name``: through the parameter's
    ``weight_loader(param, tensor, rows)`` where its quant method gave it one, else by a
    checked copy into those rows (see :func:`output_rows`)."""
    tensor = local_slice(tensor, source)
    param = getattr(layer, param_name)
    loader = getattr(param, "weight_loader", None)
    if loader is not None:
        loader(param, tensor, rows)
        return
    what = f"{param_name}[{shard}]" if shard else param_name
    copy_checked(output_rows(param, rows, layer.output_size), tensor, what)


def local_slice(tensor: torch.Tensor, source: Source | None) -> torch.Tensor:
    """This rank's slice of a checkpoint tensor along ``source``'s dim: of its elements
    when it spans the dim whole, of its entries when it holds one per equal block of it
    (block scales); the whole tensor when it has one entry there (or lacks the dim)."""
    if source is None or tensor.dim() <= source[0] or tensor.shape[source[0]] == 1:
        return tensor
    dim, first, count, full = source
    size = tensor.shape[dim]
    block = full // size if full % size == 0 else 0
    if not block or first % block or count % block:
        raise ModelError(f"a tensor of shape {tuple(tensor.shape)} cannot be split at "
                         f"{first}:{first + count} of {full} along dim {dim}")
    return tensor.narrow(dim, first // block, count // block)


def output_rows(param: torch.Tensor, rows: tuple[int, int], output_size: int) -> torch.Tensor:
    """The part of ``param`` that holds output rows ``rows`` (see :meth:`Linear.load_weight`);
    all of it when ``rows`` covers every row."""
    start, count = rows
    if count == output_size:
        return param
    block = getattr(param, "output_block", 1)
    if param.dim() == 0 or param.shape[0] * block < output_size:
        raise ModelError(f"a parameter of shape {tuple(param.shape)} has no output rows to "
                         f"load a shard into")
    if start % block:
        raise ModelError(f"a shard starting at output row {start} does not start a block of "
                         f"{block} rows")
    return param.narrow(0, start // block, -(-count // block))


def copy_checked(target: torch.Tensor, tensor: torch.Tensor, what: str) -> None:
    """``target.copy_(tensor)`` (casting dtype and device) after checking the shapes match."""
    if target.shape != tensor.shape:
        raise ModelError(f"shape {tuple(tensor.shape)} does not fit {what} "
                         f"{tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(tensor)
