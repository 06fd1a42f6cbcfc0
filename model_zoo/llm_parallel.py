"""How one :class:`~hwplug.model_zoo.llm.LLM` spreads over processes.

:class:`Parallelism` reads ``tensor_parallel_size`` and ``data_parallel_size`` of the
checked options and the launcher's environment, and owns what that takes (see :mod:`.engine.parallel`):

- tensor parallelism: spawned (``LLM(..., tensor_parallel_size=N)`` starts ranks 1..N-1)
  or launched by torchrun (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` set: every rank
  runs the script, rank 0 drives, the others serve it inside ``LLM(...)`` and come back
  as workers once it closes);
- data parallelism: replicas 1..N-1 in spawned processes, requests dealt round robin;
- CPU binding: on CPU platforms each rank or replica's engine thread is bound to its CPUs
  of the ``HWPLUG_CPU_BIND`` plan.

Tensor and data parallelism together are refused, as are a KV connector (the connector
would see rank 0's cache only) and, with data parallelism, a KV events endpoint.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.engine_loop import EngineLoop, RequestHandle, abort_unfinished
from hwplug.model_zoo.engine.output import Output
from hwplug.model_zoo.engine.parallel.binding import bind_thread, plan_for
from hwplug.model_zoo.engine.parallel.rendezvous import Rendezvous
from hwplug.model_zoo.sampling import SamplingParams

if TYPE_CHECKING:
    from torch import nn

    from hwplug.model_zoo.context import ModelContext
    from hwplug.model_zoo.engine.parallel.replicas import Replicas
    from hwplug.model_zoo.engine.parallel.tensor import TensorParallelGroup
    from hwplug.model_zoo.llm_config import LLMConfig
    from hwplug.model_zoo.parallel import TensorParallel
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)


class Parallelism:
    """The parallelism of one ``LLM`` in this process, from its checked ``config`` on
    ``platform``: spawned ranks and replicas are built from the same options. Spawned
    processes start here, on the caller's thread; their stop is appended to ``closers``.
    While they run, ``shutdown`` (the ``LLM``'s) is an exit handler that runs before
    multiprocessing's, which would terminate the workers under a step still running (as
    after Ctrl-C)."""

    def __init__(self, config: LLMConfig, platform: Platform,
                 closers: list[Callable[[], None]], shutdown: Callable[[], Any]) -> None:
        tensor_parallel_size = config.tensor_parallel_size
        data_parallel_size = config.data_parallel_size
        self.tensor_parallel_size, self.data_parallel_size = (tensor_parallel_size,
                                                              data_parallel_size)
        self.expert_parallel = config.enable_expert_parallel and tensor_parallel_size > 1
        self.platform = platform
        rendezvous = _rendezvous(tensor_parallel_size)
        if rendezvous is not None and data_parallel_size > 1:
            raise ConfigError("tensor_parallel_size and data_parallel_size > 1 together are "
                              "not supported: choose one")
        if (rendezvous or data_parallel_size > 1) and config.kv_connector:
            raise ConfigError("kv_connector needs one engine process: it is not supported "
                              "with tensor_parallel_size or data_parallel_size > 1")
        if data_parallel_size > 1 and config.kv_events_endpoint:
            raise ConfigError("kv_events_endpoint is not supported with data_parallel_size "
                              "> 1: each replica has its own prefix cache")
        world, rank = ((rendezvous.local_world_size, rendezvous.local_rank) if rendezvous
                       else (data_parallel_size, 0))
        plan = plan_for(platform, world) if world > 1 else None
        self.cpus = plan[rank] if plan else None
        self.tensor: TensorParallelGroup | None = None
        self.replicas: Replicas | None = None
        if rendezvous is not None or data_parallel_size > 1:
            atexit.register(shutdown)  # after multiprocessing's: called before it
            closers.append(lambda: atexit.unregister(shutdown))
        # what each spawned process builds its own LLM from (one process each)
        options = {name: value for name, value in config.given().items()
                   if name not in ("tensor_parallel_size", "data_parallel_size")}
        if rendezvous is not None:
            from hwplug.model_zoo.engine.parallel.tensor import TensorParallelGroup

            self.tensor = TensorParallelGroup(rendezvous, config.rendezvous_timeout_s)
            closers.append(self.tensor.close)  # before any process starts
            self.tensor.spawn({**options, "tensor_parallel_size": tensor_parallel_size}, plan)
        elif data_parallel_size > 1:
            from hwplug.model_zoo.engine.parallel.replicas import Replicas

            self.replicas = Replicas(data_parallel_size)
            closers.append(self.replicas.close)
            self.replicas.spawn(options, plan)

    @property
    def is_worker(self) -> bool:
        """Whether this process is a tensor-parallel rank > 0 (its outputs are rank 0's)."""
        return self.tensor is not None and not self.tensor.rendezvous.is_driver

    def describe(self) -> str:
        """``"tensor-parallel 2"`` (``"tensor-parallel 2, expert-parallel 2"`` with
        ``enable_expert_parallel``), ``"data-parallel 2"``, or ``""`` for one process."""
        parts = [f"{kind}-parallel {size}" for kind, size in (
            ("tensor", self.tensor_parallel_size),
            ("expert", self.tensor_parallel_size if self.expert_parallel else 1),
            ("data", self.data_parallel_size)) if size > 1]
        return ", ".join(parts)

    def start(self) -> TensorParallel | None:
        """On the engine thread, before the model is built: bind the thread to its CPUs
        and join the tensor-parallel group; this rank's share (None: the whole model)."""
        bind_thread(self.cpus)
        return self.tensor.start(self.platform, self.expert_parallel) if self.tensor else None

    def serve(self, model: nn.Module, ctx: ModelContext) -> None:
        """A worker rank: serve rank 0 until it stops the group."""
        self.tensor.serve(model, ctx)

    def engine_model(self, model: nn.Module, ctx: ModelContext, num_blocks: int) -> Any:
        """The model the engine's runner calls: under tensor parallelism rank 0's shard
        wrapped to lead the workers (which allocate ``num_blocks`` KV blocks too)."""
        return self.tensor.driver_model(model, ctx, num_blocks) if self.tensor else model

    def ready(self, is_encoder: bool) -> None:
        """After the local engine is built: wait for the data-parallel replicas."""
        if self.replicas is None:
            return
        if is_encoder:
            raise ConfigError("data_parallel_size > 1 serves decoders (generate); embed() "
                              "runs in one process: use data_parallel_size=1")
        self.replicas.wait_ready()

    def check_serving(self, method: str) -> None:
        """Raise :class:`ConfigError` on a worker rank: requests are made on rank 0."""
        if self.is_worker:
            rank = self.tensor.rendezvous.rank
            raise ConfigError(f"{method} is not available on tensor-parallel rank {rank}: "
                              "this rank served rank 0, and outputs come back on rank 0")

    def generate(self, loop: EngineLoop, prompts: Sequence[Any], token_ids: list[list[int]],
                 params: list[SamplingParams]) -> list[Output]:
        """The outputs of checked requests, in order, from this engine or the replicas."""
        def local(indices: list[int]) -> list[Output]:
            return run_requests(loop, [prompts[i] for i in indices],
                                [token_ids[i] for i in indices], [params[i] for i in indices])

        if self.replicas is None:
            return local(list(range(len(prompts))))
        return self.replicas.generate(prompts, params, local)


def run_requests(loop: EngineLoop, prompts: Sequence[Any], token_ids: list[list[int]],
                 params: list[SamplingParams]) -> list[Output]:
    """Submit checked requests to ``loop`` and wait for their outputs (in order); requests
    still running when this ends early (an error, Ctrl-C) are aborted."""
    handles: list[RequestHandle] = []
    try:
        for prompt, ids, param in zip(prompts, token_ids, params, strict=True):
            text = prompt if isinstance(prompt, str) else None
            handles.append(loop.submit(ids, param, text))
        return [handle.result() for handle in handles]
    finally:
        for handle in handles:
            abort_unfinished(loop, handle)


def _rendezvous(tensor_parallel_size: int) -> Rendezvous | None:
    """torchrun's rendezvous (its world size must be ``tensor_parallel_size``), a local one
    for spawned ranks, or None for one process."""
    launched = Rendezvous.from_env()
    if launched is not None and launched.world_size == tensor_parallel_size == 1:
        return None
    if launched is not None and launched.world_size != tensor_parallel_size:
        raise ConfigError(f"launched by torchrun with WORLD_SIZE={launched.world_size}, but "
                          f"tensor_parallel_size is {tensor_parallel_size}: they must be equal")
    if launched is None and tensor_parallel_size > 1:
        return Rendezvous.local(tensor_parallel_size)
    return launched
