"""Tensor parallelism: which share of each layer this process holds, and how ranks combine.

A :class:`TensorParallel` (in every :class:`~hwplug.model_zoo.context.ModelContext`; size 1
by default) tells the layers this process's ``rank`` among ``size`` ranks and the
:class:`~hwplug.communicator.DeviceCommunicator` that joins them. Layers written against
it (Megatron-style) split their weights when built and load only their slice:

- column-parallel linears hold an even share of the output rows (q/k/v and gate/up per
  shard), so their outputs stay split for the next layer;
- row-parallel linears hold an even share of the input columns and all-reduce their
  output (the bias is added once, by rank 0);
- attention gets an even share of the query heads; KV heads are split the same way, or,
  when there are fewer KV heads than ranks, each rank keeps the one its query heads read;
- the embedding and LM head hold an even share of the vocabulary (the embedding
  all-reduces, the head all-gathers its logits);
- with ``expert_parallel``, mixture-of-experts layers hold whole experts, a contiguous
  share each (:meth:`TensorParallel.experts`), and move each token's rows to the ranks of
  its experts and back with the communicator's ``dispatch``/``combine``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hwplug.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from hwplug.communicator import DeviceCommunicator


@dataclass(frozen=True)
class TensorParallel:
    """This process's place among ``size`` tensor-parallel ranks."""

    size: int = 1
    rank: int = 0
    communicator: DeviceCommunicator | None = None
    #: Whether mixture-of-experts layers split their experts over the ranks.
    expert_parallel: bool = False

    def share(self, total: int, what: str) -> tuple[int, int]:
        """``(start, count)`` of this rank's even share of ``total`` items of ``what``."""
        if total % self.size:
            raise ConfigError(f"{what} ({total}) does not split evenly over "
                              f"{self.size} tensor-parallel ranks")
        count = total // self.size
        return self.rank * count, count

    def experts(self, num_experts: int, rank: int | None = None) -> tuple[int, int]:
        """``(first expert, count)`` that ``rank`` (default: this one) holds under expert
        parallelism: contiguous shares, the first ``num_experts % size`` ranks one more."""
        rank = self.rank if rank is None else rank
        if num_experts < self.size:
            raise ConfigError(f"{num_experts} experts cannot be placed on {self.size} "
                              f"expert-parallel ranks: at least one expert per rank")
        base, extra = divmod(num_experts, self.size)
        return rank * base + min(rank, extra), base + (rank < extra)

    def kv_heads(self, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
        """``(first KV head, count)`` this rank keeps for its share of ``num_heads`` query
        heads: an even share, or the one KV head its query heads read when there are fewer
        KV heads than ranks."""
        if num_kv_heads % self.size == 0:
            return self.share(num_kv_heads, "KV heads")
        if self.size % num_kv_heads:
            raise ConfigError(f"{num_kv_heads} KV heads neither split over nor divide "
                              f"{self.size} tensor-parallel ranks")
        first_query_head = self.share(num_heads, "attention heads")[0]
        return first_query_head // (num_heads // num_kv_heads), 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over ranks (``x`` itself when there is one rank)."""
        return x if self.communicator is None else self.communicator.all_reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` (``x`` for one rank)."""
        return x if self.communicator is None else self.communicator.all_gather(x, dim)
