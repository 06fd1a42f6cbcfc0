"""Worker functions for tests that run several processes over torch.distributed (gloo).

:func:`run` spawns ``world_size`` processes that meet at a TCP store this process serves on
a free local port, each calling ``fn(rank, world_size, *args)``; it returns their results in
rank order. Functions must be importable (module level) for the spawn start method.
:func:`child_pids`, :func:`running` and :func:`no_new_shared_memory` check that workers leave
nothing behind. /dev/shm is the machine's: multiprocessing's queues and events under the spawn
start method (:func:`run`'s, tests/test_p2p.py's) name semaphores there, which a test of
another pytest-xdist worker counting /dev/shm would take for its own leak. So every test
that creates such objects or counts /dev/shm holds :func:`shared_memory_lock` meanwhile
(the fixture :func:`dev_shm_to_ourselves`), and never takes it twice.
"""

from __future__ import annotations

import fcntl
import io
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def child_pids(parent: int | None = None) -> set[int]:
    """Pids of the processes whose parent is ``parent`` (default: this one), zombies too,
    but multiprocessing's resource tracker (one per parent, started with the first spawned
    process and exiting with its parent)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:  # exited meanwhile
            continue
        if int(fields[1]) == parent and b"multiprocessing.resource_tracker" not in command:
            found.add(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def shared_memory() -> set[str]:
    """The names in /dev/shm (POSIX shared memory and semaphores)."""
    return set(os.listdir("/dev/shm"))


@contextmanager
def shared_memory_lock() -> Iterator[None]:
    """Hold the lock that this machine's test processes take around creating or counting
    names in /dev/shm (see the module docstring); it blocks until no other holds it."""
    with open(Path(tempfile.gettempdir()) / "hwplug-tests-dev-shm.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture
def dev_shm_to_ourselves() -> Iterator[None]:
    """The test runs holding :func:`shared_memory_lock`."""
    with shared_memory_lock():
        yield


def no_new_shared_memory(before: set[str], settle: float = 15.0) -> bool:
    """Whether /dev/shm holds nothing that is not in ``before``, waiting up to ``settle``
    seconds for what other processes on a shared machine create meanwhile to go."""
    deadline = time.monotonic() + settle
    while not shared_memory() <= before:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world_size: int, port: int, fn: Callable, args: tuple,
           results: Any) -> None:
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        buffer = io.BytesIO()  # bytes, not tensors: a child's shared memory dies with it
        torch.save(fn(rank, world_size, *args), buffer)
        results.put((rank, buffer.getvalue()))
        dist.barrier()  # every rank done communicating before any tears the group down
    finally:
        dist.destroy_process_group()


def run(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    """``fn(rank, world_size, *args)`` in ``world_size`` gloo processes; results by rank.

    The rendezvous store is served from this process, which outlives every rank: when rank
    0 served it, rank 0 sometimes aborted at exit in CI (gloo: "terminate called without
    an active exception") while its peers were still leaving the group."""
    with shared_memory_lock():  # its queues name semaphores in /dev/shm, unlinked when
        return _run(fn, world_size, *args)  # _run's locals go, before the lock does


def _run(fn: Callable, world_size: int, *args: Any) -> list[Any]:
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    processes = mp.start_processes(_entry, args=(world_size, store.port, fn, args, results),
                                   nprocs=world_size, start_method="spawn", join=False)
    # read while the ranks run: a rank blocks writing a result larger than the pipe's
    # buffer until it is read; join raises as soon as a rank fails
    collected: dict[int, bytes] = {}
    while len(collected) < world_size:
        if results.empty():
            processes.join(timeout=0.1)
        else:
            rank, data = results.get()
            collected[rank] = data
    while not processes.join():
        pass
    return [torch.load(io.BytesIO(collected[rank])) for rank in range(world_size)]


def rows(rank: int, count: int, width: int = 3) -> torch.Tensor:
    """Rank ``rank``'s deterministic ``[count, width]`` tensor."""
    return torch.arange(count * width, dtype=torch.float32).view(count, width) + 100 * rank


def collectives(rank: int, world_size: int, communicator_path: str) -> dict[str, Any]:
    """Every collective of the communicator class at ``communicator_path`` on this rank."""
    from hwplug.registry import import_object

    comm = import_object(communicator_path)()
    sizes = [rank_ + 1 for rank_ in range(world_size)]  # uneven: 1, 2, 3, ...
    mine = rows(rank, sizes[rank])
    equal = rows(rank, 2 * world_size)
    send = [(rank + dest) % 3 for dest in range(world_size)]  # rows for each destination
    routed = rows(rank, sum(send))
    received = comm.dispatch(routed, send)
    return {"all_reduce": comm.all_reduce(equal), "all_gather": comm.all_gather(equal, 1),
            "reduce_scatter": comm.reduce_scatter(equal), "all_gatherv": comm.all_gatherv(
                mine, sizes), "reduce_scatterv": comm.reduce_scatterv(rows(rank, sum(sizes)),
                                                                       sizes),
            "dispatch": received, "combine": comm.combine(received * 2, send),
            "backend": comm.all2all_backend}


def expected_collectives(world_size: int) -> list[dict[str, torch.Tensor]]:
    """What :func:`collectives` must return on each rank, computed in one process."""
    sizes = list(range(1, world_size + 1))
    equal = [rows(r, 2 * world_size) for r in range(world_size)]
    total_v = sum(rows(r, sum(sizes)) for r in range(world_size))
    send = [[(r + d) % 3 for d in range(world_size)] for r in range(world_size)]
    routed = [rows(r, sum(send[r])) for r in range(world_size)]
    result = []
    for rank in range(world_size):
        pieces = [routed[src][sum(send[src][:rank]):sum(send[src][:rank + 1])]
                  for src in range(world_size)]
        start = sum(sizes[:rank])
        result.append({
            "all_reduce": sum(equal), "all_gather": torch.cat(equal, 1),
            "reduce_scatter": sum(equal)[2 * rank:2 * rank + 2],
            "all_gatherv": torch.cat([rows(r, sizes[r]) for r in range(world_size)]),
            "reduce_scatterv": total_v[start:start + sizes[rank]],
            "dispatch": torch.cat(pieces), "combine": routed[rank] * 2})
    return result


def tensor_parallel_logits(rank: int, world_size: int, config_name: str, steps: int
                           ) -> torch.Tensor:
    """Greedy-decode logits of a tiny random model (``tiny_models.CONFIGS``) with this
    rank's tensor-parallel share; every rank returns the full logits."""
    from tiny_models import greedy_logits

    from hwplug.communicator import DeviceCommunicator
    from hwplug.model_zoo.parallel import TensorParallel

    parallel = TensorParallel(world_size, rank, DeviceCommunicator())
    return greedy_logits(config_name, steps, parallel)


def gguf_prefill_logits(rank: int, world_size: int, path: str, ids: list[int]) -> torch.Tensor:
    """Prefill logits of the GGUF at ``path`` for ``ids``, its blocks kept, with this rank's
    tensor-parallel share (``world_size`` 1: the whole model in one process)."""
    from model_harness import PagedBatch

    from hwplug.communicator import DeviceCommunicator
    from hwplug.model_zoo.context import build_model
    from hwplug.model_zoo.loaders import load_checkpoint
    from hwplug.model_zoo.parallel import TensorParallel

    parallel = TensorParallel(world_size, rank, DeviceCommunicator())
    model, ctx = build_model(load_checkpoint(Path(path)), dtype="float32", parallel=parallel)
    batch = PagedBatch(ctx, model.num_layers, 1, len(ids))
    with torch.inference_mode():
        return model.compute_logits(batch.run(model, [torch.tensor(ids)], [len(ids)]))


def gguf_row_parallel_layers(rank: int, world_size: int, path: str,
                             cases: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """For each ``(ggml type, inputs, outputs)``: a row-parallel GGUF ``Linear`` of random
    rows of that type with this rank's share, against ``x @ dequantize(W).T``. The GGUF at
    ``path`` (built whole) supplies the model context (platform, kernels, quant method)."""
    import dataclasses

    from hwplug.communicator import DeviceCommunicator
    from hwplug.kernel_registry.reference.ggml import dequantize
    from hwplug.kernel_registry.reference.ggml_weights import ggml_weight
    from hwplug.model_zoo.context import build_model
    from hwplug.model_zoo.layers import Linear
    from hwplug.model_zoo.loaders import load_checkpoint
    from hwplug.model_zoo.parallel import TensorParallel

    parallel = TensorParallel(world_size, rank, DeviceCommunicator())
    _, whole = build_model(load_checkpoint(Path(path)), dtype="float32")
    ctx = dataclasses.replace(whole, parallel=parallel)
    results = []
    for kind, inputs, outputs in cases:
        generator = torch.Generator().manual_seed(kind)
        weight = ggml_weight(generator, kind, outputs, inputs)
        x = torch.randn(3, inputs, generator=generator)
        layer = Linear(inputs, outputs, ctx, bias=True, parallel="row")
        bias = torch.randn(outputs, generator=generator)
        layer.load_weight("qweight", weight, None)
        layer.load_weight("qweight_type", torch.tensor([kind], dtype=torch.int32), None)
        layer.load_weight("bias", bias, None)
        layer.quant_method.process_weights_after_loading(layer)
        first, count = parallel.share(inputs, "input columns")
        with torch.inference_mode():
            got = layer(x[:, first:first + count])
        want = x @ dequantize(weight, kind).T + bias
        results.append({"split_by": layer.gguf_split_by, "got": got, "want": want,
                        "bytes": sum(w.numel() for _, w in layer.gguf_runs)})
    return results


def moe_greedy(rank: int, world_size: int, path: str, prompts: list[list[int]], steps: int
               ) -> dict[str, Any]:
    """The checkpoint at ``path`` (a mixture-of-experts model) with this rank's share under
    expert parallelism (``world_size`` 1: one process): the prompts' prefill logits, then
    ``steps`` greedy tokens each, decoded together; and the experts this rank holds."""
    from model_harness import PagedBatch

    from hwplug.communicator import DeviceCommunicator
    from hwplug.model_zoo.context import build_model
    from hwplug.model_zoo.layers.moe import FusedMoE
    from hwplug.model_zoo.loaders import load_checkpoint
    from hwplug.model_zoo.parallel import TensorParallel

    parallel = TensorParallel(world_size, rank, DeviceCommunicator() if world_size > 1
                              else None, expert_parallel=True)
    model, ctx = build_model(load_checkpoint(Path(path)), dtype="float32", parallel=parallel,
                             block_size=8)
    batch = PagedBatch(ctx, model.num_layers, len(prompts), max(map(len, prompts)) + steps)
    tokens = [torch.tensor(p) for p in prompts]
    prefill = model.compute_logits(batch.run(model, tokens, [len(t) for t in tokens]))
    ends = torch.tensor([len(t) for t in tokens]).cumsum(0) - 1
    last = prefill[ends]
    for _ in range(steps):
        tokens = [torch.cat([t, row.argmax(-1, keepdim=True)]) for t, row in zip(tokens, last, strict=True)]
        last = model.compute_logits(batch.run(model, [t[-1:] for t in tokens],
                                              [len(t) for t in tokens]))
    held = [list(m.experts.held) for m in model.modules() if isinstance(m, FusedMoE)]
    return {"prefill": prefill, "tokens": [t[len(p):].tolist() for t, p in
                                           zip(tokens, prompts, strict=True)], "held": held}
