"""Where the ranks of a tensor-parallel group meet, and the process groups they share.

A :class:`Rendezvous` is torch.distributed's ``env://`` description of one rank:
torchrun sets ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
and ``LOCAL_WORLD_SIZE`` for every rank it starts, and a driver that spawns its own
workers sets the same variables for them (:meth:`Rendezvous.worker_env`), so a spawned
worker joins exactly as a torchrun rank does. :func:`join` initialises the default process
group with the platform's backend (the model's collectives) and a gloo group for the
driver's commands, whose timeout outlasts any wait for requests.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from hwplug.communicator import TORCH_DIST_ALIASES
from hwplug.errors import ConfigError, UnsupportedError

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

#: The variables whose presence means "launched by torchrun (or spawned by a driver)".
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
#: How long a model collective may wait for the slowest rank (ranks run the same step).
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
#: How long a worker waits for the driver's next command (an idle engine sends none).
COMMAND_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True)
class Rendezvous:
    """This process's place in a group of ``world_size`` ranks meeting at ``addr:port``.
    ``from_environment``: joined through ``env://`` (torchrun, or spawned by a driver);
    otherwise this is a driver that spawns the other ranks itself."""

    addr: str
    port: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    from_environment: bool

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Rendezvous | None:
        """The rendezvous torchrun describes in ``environ``; None unless every one of
        :data:`LAUNCH_VARIABLES` is set. Raises :class:`ConfigError` for garbled values."""
        if not all(name in environ for name in LAUNCH_VARIABLES):
            return None
        try:
            rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
            port = int(environ.get("MASTER_PORT", "29500"))
            local_rank = int(environ.get("LOCAL_RANK", str(rank)))
            local_world_size = int(environ.get("LOCAL_WORLD_SIZE", str(world_size)))
        except ValueError as exc:
            raise ConfigError(f"torchrun's RANK, WORLD_SIZE, MASTER_PORT, LOCAL_RANK and "
                              f"LOCAL_WORLD_SIZE must be integers: {exc}") from None
        if not 0 <= rank < world_size or not 0 <= local_rank < local_world_size:
            raise ConfigError(f"RANK={rank} / LOCAL_RANK={local_rank} is outside WORLD_SIZE="
                              f"{world_size} / LOCAL_WORLD_SIZE={local_world_size}")
        return cls(environ["MASTER_ADDR"], port, rank, world_size, local_rank,
                   local_world_size, from_environment=True)

    @classmethod
    def local(cls, world_size: int) -> Rendezvous:
        """Rank 0 of ``world_size`` ranks on this host, meeting on a free local port."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        return cls("127.0.0.1", port, 0, world_size, 0, world_size, from_environment=False)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def worker_env(self, rank: int) -> dict[str, str]:
        """The torchrun variables of ``rank`` on this host."""
        return {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port), "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size)}


def torch_backend(platform: Platform) -> str:
    """The torch.distributed backend of ``platform.dist_backend`` (rccl is torch's nccl);
    :class:`UnsupportedError` when this torch build lacks it."""
    import torch.distributed as dist

    name = platform.dist_backend
    torch_name = TORCH_DIST_ALIASES.get(name, (name, ""))[0]
    if not dist.is_available() or not dist.is_backend_available(torch_name):
        raise UnsupportedError(f"platform {platform.name} collects over {name!r}, which this "
                               f"torch build does not provide: tensor parallelism needs it")
    return torch_name


@dataclass
class ProcessGroups:
    """The groups of one tensor-parallel engine: ``commands`` (gloo, driver to workers)
    and the default group (model collectives), destroyed by :meth:`destroy` when this
    engine created it."""

    commands: Any
    owns_default: bool

    def destroy(self) -> None:
        """Destroy the groups (idempotent)."""
        import torch.distributed as dist

        if self.commands is not None and dist.is_initialized():
            dist.destroy_process_group(self.commands)
        self.commands = None
        if self.owns_default and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_default = False


def join(rendezvous: Rendezvous, platform: Platform, timeout_s: float) -> ProcessGroups:
    """Join the rendezvous: the default group over the platform's backend (reused when the
    launcher's script already created one of the same size), then the command group.
    Every rank must join within ``timeout_s`` seconds, else torch.distributed raises (a
    ``RuntimeError``); once joined, collectives wait up to :data:`COLLECTIVE_TIMEOUT`."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    backend = torch_backend(platform)
    owns = not dist.is_initialized()
    if owns:
        init_method = "env://" if rendezvous.from_environment else (
            f"tcp://{rendezvous.addr}:{rendezvous.port}")
        logger.info("rank %d of %d joins %s over %s", rendezvous.rank, rendezvous.world_size,
                    init_method, backend)
        # torch names a process group's store keys by a per-process counter, which an
        # earlier failed init_process_group in this process leaves raised (destroying the
        # default group resets it): a driver with such a past would wait on keys its fresh
        # workers never write. Every rank starts from the same count.
        distributed_c10d._world.group_count = 0
        dist.init_process_group(backend, init_method=init_method, rank=rendezvous.rank,
                                world_size=rendezvous.world_size,
                                timeout=timedelta(seconds=timeout_s))
        distributed_c10d._set_pg_timeout(COLLECTIVE_TIMEOUT)  # joined: the steps' wait
    elif dist.get_world_size() != rendezvous.world_size:
        raise ConfigError(f"the default process group has {dist.get_world_size()} ranks; "
                          f"tensor_parallel_size is {rendezvous.world_size}")
    commands = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    distributed_c10d._set_pg_timeout(COMMAND_TIMEOUT, commands)  # joined: idle waits
    return ProcessGroups(commands, owns)
