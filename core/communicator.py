"""``DeviceCommunicator``: the collectives tensor and expert parallelism use, over a
``torch.distributed`` process group.

Every platform gets :class:`DeviceCommunicator` itself, which calls torch.distributed with
the group's backend (gloo, nccl, rccl, xccl); a plugin whose hardware does some of them
better names a subclass in ``Platform.device_communicator`` and overrides those. Sizes are
rows along ``dim`` (0 by default); ``sizes[r]`` is rank ``r``'s share, so uneven splits
are first-class (``all_gatherv``, ``reduce_scatterv``, ``dispatch``/``combine``).

``dispatch``/``combine`` are the all-to-all of expert parallelism: ``dispatch`` sends the
first ``send_sizes[0]`` rows to rank 0, the next ``send_sizes[1]`` to rank 1, and so on,
and returns what every rank sent here, in rank order; ``combine`` sends processed rows back
where they came from. The all-to-all algorithm is named by ``HWPLUG_ALL2ALL_BACKEND``
among the class's :attr:`~DeviceCommunicator.all2all_backends`; an unknown or unsupported
name warns once and uses the class's first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from hwplug import envs
from hwplug.errors import ConfigError
from hwplug.interface import StrictInterface
from hwplug.registry import import_object

if TYPE_CHECKING:
    import torch

    from hwplug.platform_interface import Platform

__all__ = ["TORCH_DIST_ALIASES", "DeviceCommunicator", "communicator_for"]

logger = logging.getLogger(__name__)
_warned: set[tuple[str, str]] = set()

#: Collective libraries a platform may name (``Platform.dist_backend``) that
#: torch.distributed registers under another backend name (the one to pass
#: ``init_process_group``), and why.
TORCH_DIST_ALIASES = {"rccl": ("nccl", "ROCm builds of torch register RCCL under it")}


class DeviceCommunicator(StrictInterface):
    """Collectives over ``group`` (None: the default process group)."""

    _interface_root = True

    #: All-to-all algorithms this communicator implements, the default first.
    all2all_backends: ClassVar[tuple[str, ...]] = ("all_to_all",)

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist

        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.all2all_backend = self._choose_all2all(envs.HWPLUG_ALL2ALL_BACKEND)

    def _choose_all2all(self, requested: str | None) -> str:
        default = self.all2all_backends[0]
        if requested is None or requested in self.all2all_backends:
            return requested or default
        key = (type(self).__name__, requested)
        if key not in _warned:
            _warned.add(key)
            logger.warning("%s does not implement the all-to-all backend %r (it has %s); "
                           "using %r", type(self).__name__, requested,
                           ", ".join(self.all2all_backends), default)
        return default

    # --- equal shares -------------------------------------------------------------------

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's ``x`` (same shape everywhere)."""
        import torch.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's ``x`` concatenated along ``dim`` in rank order."""
        return self.all_gatherv(x, [x.shape[dim]] * self.world_size, dim)

    def reduce_scatter(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """This rank's equal share along ``dim`` of the sum of every rank's ``x``."""
        share, left = divmod(x.shape[dim], self.world_size)
        if left:
            raise ConfigError(f"reduce_scatter: {x.shape[dim]} rows do not split into "
                              f"{self.world_size} equal shares; use reduce_scatterv")
        return self.reduce_scatterv(x, [share] * self.world_size, dim)

    # --- uneven shares --------------------------------------------------------------------

    def all_gatherv(self, x: torch.Tensor, sizes: Sequence[int], dim: int = 0) -> torch.Tensor:
        """Every rank's ``x`` (``sizes[r]`` rows along ``dim`` on rank ``r``) concatenated."""
        import torch
        import torch.distributed as dist

        self._check_sizes(sizes, x.shape[dim], "all_gatherv")
        rows = x.movedim(dim, 0)
        widest = max(sizes)  # backends gather equal shapes: pad every share to the largest
        padded = torch.cat((rows, rows.new_zeros((widest - rows.shape[0], *rows.shape[1:]))))
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]).movedim(0, dim)

    def reduce_scatterv(self, x: torch.Tensor, sizes: Sequence[int], dim: int = 0
                        ) -> torch.Tensor:
        """Rank ``r``'s ``sizes[r]`` rows (along ``dim``) of the sum of every rank's ``x``
        (here an all-reduce, then this rank's slice: gloo has no reduce-scatter)."""
        if sum(sizes) != x.shape[dim] or len(sizes) != self.world_size:
            raise ConfigError(f"reduce_scatterv: sizes {list(sizes)} must be one per rank "
                              f"({self.world_size}) and add up to {x.shape[dim]}")
        total = self.all_reduce(x.movedim(dim, 0).contiguous())
        start = sum(sizes[:self.rank])
        return total[start:start + sizes[self.rank]].movedim(0, dim)

    def _check_sizes(self, sizes: Sequence[int], mine: int, what: str) -> None:
        if len(sizes) != self.world_size or sizes[self.rank] != mine:
            raise ConfigError(f"{what}: sizes {list(sizes)} must be one per rank "
                              f"({self.world_size}) with this rank's {mine} at {self.rank}")

    # --- all-to-all (expert parallelism) ---------------------------------------------------

    def dispatch(self, x: torch.Tensor, send_sizes: Sequence[int]) -> torch.Tensor:
        """Send ``x``'s rows to ranks by ``send_sizes``; the rows every rank sent here."""
        if sum(send_sizes) != x.shape[0] or len(send_sizes) != self.world_size:
            raise ConfigError(f"dispatch: send_sizes {list(send_sizes)} must be one per rank "
                              f"({self.world_size}) and add up to {x.shape[0]} rows")
        return self._dispatch(x, self._routes(send_sizes, x.device))

    def combine(self, x: torch.Tensor, send_sizes: Sequence[int]) -> torch.Tensor:
        """Undo :meth:`dispatch`: ``x`` holds the rows received there (in rank order);
        ``send_sizes`` are the sizes this rank passed to :meth:`dispatch`. Returns this
        rank's rows back, in their original order."""
        routes = self._routes(send_sizes, x.device)
        received = sum(row[self.rank] for row in routes)
        if x.shape[0] != received:
            raise ConfigError(f"combine: {x.shape[0]} rows given, {received} were dispatched "
                              "here")
        return self._combine(x, routes)

    def _routes(self, send_sizes: Sequence[int], device: torch.device) -> list[list[int]]:
        """Every rank's ``send_sizes``: ``routes[src][dst]`` rows go from src to dst."""
        import torch

        if len(send_sizes) != self.world_size:
            raise ConfigError(f"send_sizes {list(send_sizes)} must be one per rank "
                              f"({self.world_size})")
        return self.all_gather(torch.tensor([list(send_sizes)], device=device)).tolist()

    def _dispatch(self, x: torch.Tensor, routes: list[list[int]]) -> torch.Tensor:
        """The all-to-all that moves ``routes[src][dst]`` rows from src to dst."""
        import torch.distributed as dist

        recv_sizes = [row[self.rank] for row in routes]
        out = x.new_empty((sum(recv_sizes), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv_sizes, routes[self.rank],
                               group=self.group)
        return out

    def _combine(self, x: torch.Tensor, routes: list[list[int]]) -> torch.Tensor:
        """The all-to-all back: :meth:`_dispatch` with the directions swapped."""
        import torch.distributed as dist

        recv_sizes = [row[self.rank] for row in routes]
        out = x.new_empty((sum(routes[self.rank]), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), routes[self.rank], recv_sizes,
                               group=self.group)
        return out


def communicator_for(platform: Platform, group: Any = None) -> DeviceCommunicator:
    """The platform's communicator (``Platform.device_communicator``, default
    :class:`DeviceCommunicator`) over ``group``."""
    target = platform.device_communicator
    cls = import_object(target) if target else DeviceCommunicator
    return cls(group)
