"""One rank's side of a tensor-parallel engine: join, build the shard, drive or serve, stop.

The driver (rank 0, the process that made the ``LLM``) runs the engine on its shard,
wrapped in a :class:`~.commands.DriverModel`; ranks 1..N-1 build their shards with the
same options and :meth:`TensorParallelGroup.serve` the driver's commands until it stops
them. Spawned, those ranks are processes the driver started (:data:`RUN_RANK`: an ``LLM``
built from the driver's options, joining through the same torchrun variables); under
torchrun they are the script's ``LLM(...)`` calls on ranks > 0.

Failure: when a step fails on the driver (gloo raises as soon as a peer's socket closes),
the group is abandoned: a dead worker is named in a :class:`~hwplug.errors.WorkerError`
(rank, pid, exit code or signal, and what it reported), the other workers are stopped,
and every later step raises the same error. Workers whose driver dies see their command
broadcast fail and exit with a :class:`~hwplug.errors.WorkerError`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hwplug.communicator import communicator_for
from hwplug.errors import ConfigError, WorkerError
from hwplug.model_zoo.engine.model_runner import ModelRunner, StepInputs
from hwplug.model_zoo.engine.parallel.binding import Plan, plan_setting
from hwplug.model_zoo.engine.parallel.commands import CommandChannel, DriverModel
from hwplug.model_zoo.engine.parallel.processes import WorkerProcesses
from hwplug.model_zoo.engine.parallel.rendezvous import (
    ProcessGroups,
    Rendezvous,
    join,
    torch_backend,
)
from hwplug.model_zoo.parallel import TensorParallel

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

#: The program a spawned rank's process runs (named: it builds an ``LLM``, a layer above).
RUN_RANK = "hwplug.model_zoo.workers:run_rank"

#: Seconds workers get to exit after the stop command before they are terminated.
STOP_TIMEOUT = 30.0


class TensorParallelGroup:
    """This process's rank of a tensor-parallel engine. Made on the caller's thread (a
    spawning driver starts its workers then); everything else runs on the engine thread,
    except :meth:`close`, which runs after that thread has stopped."""

    def __init__(self, rendezvous: Rendezvous, join_timeout_s: float) -> None:
        self.rendezvous = rendezvous
        self.join_timeout_s = join_timeout_s
        self.processes: WorkerProcesses | None = None
        self._groups: ProcessGroups | None = None
        self._channel: CommandChannel | None = None
        self._failure: BaseException | None = None
        self._peers: dict[int, int] = {}

    def spawn(self, options: dict[str, Any], plan: Plan | None) -> None:
        """A driver that is not launched by torchrun: start ranks 1..N-1, each an ``LLM``
        built with ``options`` (keyword arguments) and bound by ``plan``."""
        if not self.rendezvous.is_driver or self.rendezvous.from_environment:
            return
        self.processes = WorkerProcesses("tensor-parallel rank")
        for rank in range(1, self.size):
            env = {**self.rendezvous.worker_env(rank), "HWPLUG_CPU_BIND": plan_setting(plan)}
            self.processes.spawn(rank, RUN_RANK, env, options)

    @property
    def size(self) -> int:
        return self.rendezvous.world_size

    def start(self, platform: Platform, expert_parallel: bool = False) -> TensorParallel:
        """Join the process groups (the rank's device chosen first) and return the
        :class:`TensorParallel` this rank's shard is built with (``expert_parallel``: its
        mixture-of-experts layers hold whole experts)."""
        torch_backend(platform)  # an unsupported backend fails before anyone waits
        if platform.device_type != "cpu":
            torch.accelerator.set_device_index(self.rendezvous.local_rank)
        try:
            self._groups = join(self.rendezvous, platform, self.join_timeout_s)
        except RuntimeError as exc:  # torch.distributed's: a rank did not join in time
            raise self._join_failure(exc) from exc
        self._channel = CommandChannel(self._groups.commands,
                                       torch.device(platform.device_type))
        return TensorParallel(self.size, self.rendezvous.rank, communicator_for(platform),
                              expert_parallel)

    def driver_model(self, model: nn.Module, ctx: ModelContext, num_blocks: int
                     ) -> DriverModel:
        """Rank 0: have every worker allocate ``num_blocks`` KV blocks, check that all
        ranks settled the same engine configuration, and wrap ``model``."""
        ranks = self.run("start", num_blocks, lambda: self._channel.gather(
            (os.getpid(), ctx.engine_config)))
        self._peers = {rank: pid for rank, (pid, _) in enumerate(ranks)}
        for rank, (_, config) in enumerate(ranks):
            if config != ctx.engine_config:
                raise ConfigError(f"tensor-parallel rank {rank} settled {config}, rank 0 "
                                  f"{ctx.engine_config}: every rank needs the same options")
        return DriverModel(model, self)

    def run(self, kind: str, payload: Any, local: Callable[[], Any]) -> Any:
        """Rank 0: send the command, then return ``local()``. A failure abandons the group
        (see the module's docstring)."""
        if self._failure is not None:
            raise self._failure
        try:
            self._channel.send(kind, payload)
            return local()
        except Exception as exc:
            self._failure = self._diagnose(exc)
            self._release(stop_timeout=STOP_TIMEOUT)
            if self._failure is exc:
                raise
            raise self._failure from exc

    def serve(self, model: nn.Module, ctx: ModelContext) -> None:
        """Ranks > 0: follow rank 0's commands until it stops the group."""
        runner: ModelRunner | None = None
        try:
            while True:
                kind, payload = self._receive()
                if kind == "stop":
                    return
                if kind == "start":
                    runner = ModelRunner(model, ctx, payload)
                    self._channel.gather((os.getpid(), ctx.engine_config))
                elif kind == "forward":
                    input_ids, positions, metadata, model_kwargs = payload
                    runner.forward(StepInputs(input_ids, positions, metadata, None),
                                   **model_kwargs)
                else:
                    with torch.inference_mode():
                        model.compute_logits(payload)
        finally:
            self._release(stop_timeout=0.0)

    def close(self) -> None:
        """Rank 0: stop the workers (the stop command, then waiting, terminating, killing)
        and destroy the process groups; idempotent, also after a failure."""
        joined = self._channel is not None
        if joined and self._failure is None and self.rendezvous.is_driver:
            try:
                self._channel.send("stop", None)
            except Exception:  # a worker already gone: stopping goes on regardless
                logger.warning("could not send the stop command", exc_info=True)
        self._release(stop_timeout=STOP_TIMEOUT if joined else 0.0)  # waiting to join: stop

    def _receive(self) -> tuple[str, Any]:
        try:
            return self._channel.receive()
        except RuntimeError as exc:  # gloo: the driver's socket closed
            raise WorkerError(f"tensor-parallel rank {self.rendezvous.rank} lost the driver "
                              f"(rank 0): {exc}", rank=0) from exc

    def _join_failure(self, exc: Exception) -> WorkerError:
        """The :class:`WorkerError` of a failed join: the spawned rank that died, else the
        ranks that did not join within ``join_timeout_s``."""
        died = self.processes.failure() if self.processes is not None else None
        if died is not None:
            return died
        where = f"{self.rendezvous.addr}:{self.rendezvous.port}"
        return WorkerError(f"tensor-parallel rank {self.rendezvous.rank} of {self.size}: the "
                           f"other ranks did not join at {where} within "
                           f"{self.join_timeout_s:g} s (rendezvous_timeout_s): {exc}")

    def _diagnose(self, exc: Exception) -> BaseException:
        """The worker death behind ``exc``, if there is one, else ``exc``."""
        if self.processes is not None:
            return self.processes.failure() or exc
        gone = {rank: pid for rank, pid in self._peers.items() if rank and not _alive(pid)}
        if not gone:
            return exc
        rank, pid = min(gone.items())
        return WorkerError("; ".join(f"tensor-parallel rank {r} (pid {p}) is gone (its exit "
                                     "status is its launcher's)" for r, p in gone.items())
                           + f": {exc}", rank=rank, pid=pid)

    def _release(self, stop_timeout: float) -> None:
        self._channel = None
        if self._groups is not None:
            try:
                self._groups.destroy()
            except Exception:
                logger.warning("destroying the process groups failed", exc_info=True)
            self._groups = None
        if self.processes is not None:
            self.processes.stop(stop_timeout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
