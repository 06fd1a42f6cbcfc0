"""``LLM(data_parallel_size=N)``: replicas in spawned processes share a generate call.

Greedy outputs of 2 replicas equal one engine's, in request order, with prompts served by
both replicas; a replica is bound to its CPUs of the ``HWPLUG_CPU_BIND`` plan; a replica
that dies fails the calls that need it with a :class:`WorkerError` naming it; closing and
garbage collection leave no process and no shared-memory segment behind.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys

import pytest
import torch
from dist_workers import (  # noqa: F401 - dev_shm_to_ourselves is a fixture
    child_pids,
    dev_shm_to_ourselves,
    no_new_shared_memory,
    running,
    shared_memory,
)
from tiny_llama import random_prompts, tiny_model_dir  # noqa: F401 (the model_dir fixture)

import hwplug
from hwplug.errors import ConfigError, WorkerError

GREEDY = hwplug.SamplingParams(max_tokens=10)


def replica_pids() -> list[int]:
    """Pids of this process's data-parallel replicas."""
    return [p.pid for p in multiprocessing.active_children()
            if "data-parallel replica" in p.name]


@pytest.fixture
def keep_torch_threads():
    """The driver's engine thread binds itself and sets torch's thread count: restore it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_two_replicas_return_what_one_engine_does_in_request_order(model_dir,
                                                                   keep_torch_threads):
    prompts = random_prompts(seed=7, count=16)
    alone = hwplug.LLM(model_dir, num_kv_blocks=64)
    want = alone.generate(prompts, GREEDY)
    alone.close()
    before, shm = child_pids(), shared_memory()

    llm = hwplug.LLM(model_dir, num_kv_blocks=64, data_parallel_size=2)
    (replica,) = replica_pids()
    assert llm.parallelism.describe() == "data-parallel 2"
    got = llm.generate(prompts, GREEDY)
    assert [(o.prompt_token_ids, o.token_ids, o.text) for o in got] == [
        (o.prompt_token_ids, o.token_ids, o.text) for o in want]
    served = ["replica1" in o.request_id for o in got]
    assert served == [i % 2 == 1 for i in range(16)]  # dealt round robin
    one = llm.generate(prompts[0], GREEDY)  # the turn carries on: replica 0's again
    assert one[0].token_ids == want[0].token_ids and "replica" not in one[0].request_id
    assert llm.generate(prompts[1], GREEDY)[0].request_id.endswith("@replica1")
    stream = llm.stream(prompts[2], GREEDY)  # a stream is served by the driver's replica
    assert "".join(stream) == want[2].text
    del llm, stream  # garbage collection closes it: the replica is stopped and reaped
    gc.collect()
    assert not running(replica)
    assert child_pids() <= before and no_new_shared_memory(shm)


@pytest.mark.slow
def test_each_replica_runs_on_its_cpus_of_the_binding_plan(model_dir, monkeypatch,
                                                           keep_torch_threads):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs")
    monkeypatch.setenv("HWPLUG_CPU_BIND", f"{cpus[0]}|{cpus[1]}")
    llm = hwplug.LLM(model_dir, num_kv_blocks=64, data_parallel_size=2)
    try:
        (replica,) = replica_pids()
        assert os.sched_getaffinity(replica) == {cpus[1]}  # its main thread, bound first
        engine_thread = llm._loop.call(lambda: os.sched_getaffinity(0))
        assert engine_thread == {cpus[0]}
        assert os.sched_getaffinity(0) == set(cpus)  # the caller's thread is left alone
    finally:
        llm.close()


@pytest.mark.slow
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_a_dead_replica_fails_the_calls_that_need_it_with_a_worker_error(model_dir,
                                                                         keep_torch_threads):
    before, shm = child_pids(), shared_memory()
    llm = hwplug.LLM(model_dir, num_kv_blocks=64, data_parallel_size=2)
    (replica,) = replica_pids()
    os.kill(replica, signal.SIGKILL)
    named = rf"data-parallel replica 1 \(pid {replica}\) was killed by signal SIGKILL"
    with pytest.raises(WorkerError, match=named) as caught:
        for _ in range(3):  # one-prompt calls alternate replicas: one of them needs it
            llm.generate(random_prompts(seed=8, count=1), GREEDY)
    assert (caught.value.rank, caught.value.pid, caught.value.exitcode) == (
        1, replica, -signal.SIGKILL)
    with pytest.raises(WorkerError, match=named):  # and so does every later call
        llm.generate(random_prompts(seed=9, count=2), GREEDY)
    llm.close()
    assert child_pids() <= before and no_new_shared_memory(shm)


@pytest.mark.slow
def test_embedding_models_refuse_replicas_and_stop_the_started_ones(keep_torch_threads):
    before = child_pids()
    with pytest.raises(ConfigError, match="data_parallel_size > 1 serves decoders"):
        hwplug.LLM("all-minilm-l6-v2", data_parallel_size=2)
    assert child_pids() <= before


@pytest.mark.slow
def test_cli_generate_with_two_replicas_prints_what_one_process_does(model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(["the quick brown fox", "hello world", "one two three",
                                  "a b c d"]) + "\n")

    def generate(*flags: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([sys.executable, "-m", "hwplug", "generate", "--model",
                              str(model_dir), "--prompts-file", str(prompts), "--max-tokens",
                              "8", *flags], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return out

    alone, replicated = generate(), generate("--data-parallel-size", "2")
    assert replicated.stdout == alone.stdout and alone.stdout.count("[3] a b c d") == 1
    assert ", data-parallel 2; kernels:" in replicated.stderr
