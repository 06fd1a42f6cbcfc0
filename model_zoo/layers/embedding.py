"""Token embedding and the LM head that maps hidden states to vocabulary logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hwplug.kernel_registry import ops


class VocabEmbedding(nn.Module):
    """``ids [T] int64`` -> rows of ``weight [num_embeddings, embedding_dim]`` (``[T, dim]``)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, dtype=dtype),
                                   requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead(nn.Module):
    """``hidden [N, dim]`` -> float32 logits ``[N, vocab_size]``.

    With ``tied_to`` the head shares that embedding's weight (one parameter, loaded under
    the embedding's name); otherwise it owns ``weight [vocab_size, dim]``.
    """

    def __init__(self, vocab_size: int, hidden_size: int, dtype: torch.dtype,
                 tied_to: VocabEmbedding | None = None) -> None:
        super().__init__()
        self.weight = (tied_to.weight if tied_to is not None else
                       nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype),
                                    requires_grad=False))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return ops.linear(hidden, self.weight).float()
