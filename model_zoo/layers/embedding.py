"""Token embedding and the LM head that maps hidden states to vocabulary logits.

Both store their table through a quant method: the model's when it quantizes vocabulary
tables too (``QuantMethod.quantizes_vocab``, e.g. ``gguf``: the embedding dequantizes only
the rows it looks up), else ``unquantized``. Under tensor parallelism both hold an even
share of the vocabulary rows: the embedding looks up the ids in its share (zeros for the
others) and all-reduces; the head computes its share of the logits and all-gathers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.model_zoo.kernel_binding import plan_and_dtype
from hwplug.model_zoo.layers.linear import load_rows
from hwplug.model_zoo.parallel import TensorParallel
from hwplug.model_zoo.quant_methods.unquantized import UnquantizedLinearMethod
from hwplug.quantization import QuantMethod

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext


def vocab_method(quant_method: QuantMethod | None) -> QuantMethod:
    """The quant method of a vocabulary table in a model quantized by ``quant_method``."""
    if quant_method is not None and quant_method.quantizes_vocab:
        return quant_method
    return UnquantizedLinearMethod()


class _VocabTable(nn.Module):
    """This rank's share of a ``[num_rows, dim]`` table, created and loaded by its quant
    method (parameters as for a linear layer of ``dim`` inputs and ``num_rows`` outputs),
    in the model's dtype, its kernels bound from the model's plan."""

    def __init__(self, num_rows: int, dim: int, ctx: ModelContext,
                 parallel: TensorParallel | None, quant_method: QuantMethod | None) -> None:
        super().__init__()
        self.kernels, dtype = plan_and_dtype(ctx, type(self).__name__)
        self.dtype = dtype
        self.tp = parallel or TensorParallel()
        self.first, rows = self.tp.share(num_rows, "vocabulary rows")
        self.source = (0, self.first, rows, num_rows) if self.tp.size > 1 else None
        self.input_size, self.output_size = dim, rows
        self.quant_method = vocab_method(quant_method)
        self.quant_method.create_weights(self, dim, rows, dtype, False)

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        """Load this rank's rows of the checkpoint table."""
        load_rows(self, param_name, tensor, self.source, (0, self.output_size))


class VocabEmbedding(_VocabTable):
    """``ids [T] int64`` -> rows of the ``[num_embeddings, embedding_dim]`` table
    (``[T, dim]`` in the model dtype), looked up by its quant method's ``embed_op``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, ctx: ModelContext,
                 parallel: TensorParallel | None = None,
                 quant_method: QuantMethod | None = None) -> None:
        super().__init__(num_embeddings, embedding_dim, ctx, parallel, quant_method)
        self.embed_kernel = self.kernels.bind(self.quant_method.embed_op, "int64")
        #: Set by an :class:`LMHead` tied to this table, before loading: the quant method
        #: may then hold the table in its head's layout (and look rows up there).
        self.serves_head = False

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.quant_method.embed(self, ids).to(self.dtype)
        local = ids - self.first
        mine = (local >= 0) & (local < self.output_size)
        rows = self.quant_method.embed(self, local.clamp(0, self.output_size - 1)).to(self.dtype)
        return self.tp.all_reduce(rows * mine[:, None].to(rows.dtype))


class LMHead(_VocabTable):
    """``hidden [N, dim]`` -> float32 logits ``[N, vocab_size]``.

    With ``tied_to`` the head multiplies by that embedding's table (loaded under the
    embedding's name; the head owns no parameters); otherwise it owns its table.
    """

    def __init__(self, vocab_size: int, hidden_size: int, ctx: ModelContext,
                 tied_to: VocabEmbedding | None = None,
                 parallel: TensorParallel | None = None,
                 quant_method: QuantMethod | None = None) -> None:
        if tied_to is None:
            super().__init__(vocab_size, hidden_size, ctx, parallel, quant_method)
            self._table: tuple[_VocabTable, ...] = (self,)
        else:
            nn.Module.__init__(self)
            self.tp = tied_to.tp
            self._table = (tied_to,)  # a tuple: not registered twice as a submodule
            tied_to.serves_head = True

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        table = self._table[0]
        logits = table.quant_method.apply(table, hidden).float()
        return self.tp.all_gather(logits, dim=-1)
