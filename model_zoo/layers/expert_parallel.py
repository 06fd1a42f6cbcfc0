"""Expert parallelism: each rank holds a contiguous share of a mixture-of-experts layer's
experts (:meth:`~hwplug.model_zoo.parallel.TensorParallel.experts`) and tokens travel to
the ranks of the experts they chose.

The hidden states are the same on every rank (tensor parallelism leaves them replicated).
:class:`ExpertRouter` gives each rank an even share of the tokens; a rank routes its share,
sends one row per (token, chosen expert) pair to the rank holding that expert with the
communicator's ``dispatch`` (an all-to-all), together with the expert's index on that rank
and the routing weight; the receiving rank runs its experts on the rows it got (one expert
per row), ``combine`` sends the weighted results back, each token sums its pairs (in
fp32), and an all-gather gives every rank every token's output again.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.parallel import TensorParallel

__all__ = ["ExpertRouter", "LocalExperts"]

#: ``(rows [R, H], weights [R, 1] fp32, ids [R, 1] int64 in this rank's experts) -> the
#: weighted expert outputs [R, H]``: the ``moe_experts`` (or ``ggml_moe_experts``) op over
#: this rank's experts, with one slot per row.
LocalExperts = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
#: ``rows [t, H] -> (topk_weights [t, k] fp32, topk_ids [t, k] int64)``: the layer's routing.
Route = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class ExpertRouter:
    """Moves tokens between the ranks of ``tp`` for a layer of ``num_experts`` experts."""

    def __init__(self, tp: TensorParallel, num_experts: int) -> None:
        if tp.communicator is None:
            raise ConfigError("expert parallelism needs the ranks' communicator")
        self.tp, self.communicator = tp, tp.communicator
        shares = [tp.experts(num_experts, rank) for rank in range(tp.size)]
        #: expert -> the rank that holds it, and that rank's first expert
        self.owner = torch.tensor([rank for rank, (_, count) in enumerate(shares)
                                   for _ in range(count)])
        self.first = torch.tensor([first for first, _ in shares])

    def token_shares(self, tokens: int) -> list[int]:
        """How many of ``tokens`` each rank routes (even shares, the first ranks one more)."""
        base, extra = divmod(tokens, self.tp.size)
        return [base + (rank < extra) for rank in range(self.tp.size)]

    def __call__(self, x: torch.Tensor, route: Route, experts: LocalExperts) -> torch.Tensor:
        """``x [T, H]`` (the same on every rank) -> the routed experts' output ``[T, H]``,
        the same on every rank."""
        shares = self.token_shares(x.shape[0])
        start = sum(shares[:self.tp.rank])
        mine = x[start:start + shares[self.tp.rank]]
        weights, ids = route(mine)
        token = torch.arange(mine.shape[0], device=x.device).repeat_interleave(ids.shape[1])
        ids, weights = ids.reshape(-1), weights.reshape(-1)
        rank = self.owner.to(x.device)[ids]
        order = torch.argsort(rank, stable=True)
        token, ids, weights, rank = token[order], ids[order], weights[order], rank[order]
        send = torch.bincount(rank, minlength=self.tp.size).tolist()
        local_ids = ids - self.first.to(x.device)[rank]
        meta = torch.stack((local_ids.double(), weights.double()), dim=1)
        rows = self.communicator.dispatch(mine[token], send)
        got = self.communicator.dispatch(meta, send)
        out = experts(rows, got[:, 1:].float(), got[:, :1].long())
        back = self.communicator.combine(out, send)
        summed = torch.zeros(mine.shape, dtype=torch.float32, device=x.device)
        summed.index_add_(0, token, back.float())
        return self.communicator.all_gatherv(summed.to(x.dtype), shares)


def held_experts(stack: torch.Tensor, total: int, held: range) -> torch.Tensor:
    """The experts ``held`` of a checkpoint's ``stack`` of ``total`` (``[total, ...]``; a
    view). Raises :class:`ModelError` for a stack of another number of experts."""
    if stack.ndim < 1 or stack.shape[0] != total:
        raise ModelError(f"a stack of shape {tuple(stack.shape)} does not hold {total} "
                         f"experts")
    return stack[held.start:held.stop]
