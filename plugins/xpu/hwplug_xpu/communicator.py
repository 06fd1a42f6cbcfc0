"""``XpuCommunicator``: all-to-all as all-gather + reduce-scatter on Intel GPUs.

oneCCL's all-to-all is slow or missing on XPU, so expert parallelism there routes tokens
the way vLLM's ``AgRsAll2AllManager`` does (vLLM #32654): ``dispatch`` all-gathers every
rank's rows and keeps the ones sent here; ``combine`` puts the processed rows back at their
place in that gathered order, zeros elsewhere, and reduce-scatters, so each rank gets the
sum over ranks of its own rows, which only their processor contributed. Same contract as
:class:`hwplug.communicator.DeviceCommunicator`'s; more bytes moved, no all-to-all used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.communicator import DeviceCommunicator

if TYPE_CHECKING:
    import torch


class XpuCommunicator(DeviceCommunicator):
    """The default collectives; all-to-all by ``allgather_reducescatter`` (the default) or
    torch.distributed's ``all_to_all`` where ``HWPLUG_ALL2ALL_BACKEND`` names it."""

    all2all_backends: ClassVar[tuple[str, ...]] = ("allgather_reducescatter", "all_to_all")

    def _dispatch(self, x: torch.Tensor, routes: list[list[int]]) -> torch.Tensor:
        if self.all2all_backend == "all_to_all":
            return super()._dispatch(x, routes)
        import torch

        everything = self.all_gatherv(x, [sum(row) for row in routes])
        return torch.cat([everything[start:start + row[self.rank]]
                          for start, row in zip(self._starts(routes), routes, strict=True)])

    def _combine(self, x: torch.Tensor, routes: list[list[int]]) -> torch.Tensor:
        if self.all2all_backend == "all_to_all":
            return super()._combine(x, routes)
        totals = [sum(row) for row in routes]
        placed = x.new_zeros((sum(totals), *x.shape[1:]))
        taken = 0
        for start, row in zip(self._starts(routes), routes, strict=True):
            placed[start:start + row[self.rank]] = x[taken:taken + row[self.rank]]
            taken += row[self.rank]
        return self.reduce_scatterv(placed, totals)

    def _starts(self, routes: list[list[int]]) -> list[int]:
        """Where, in the all-gathered rows, each source rank's rows for this rank begin."""
        starts, offset = [], 0
        for row in routes:
            starts.append(offset + sum(row[:self.rank]))
            offset += sum(row)
        return starts
