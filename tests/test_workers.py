"""``LLM(tensor_parallel_size=N)``: spawned or torchrun ranks, identical tokens, clean exits.

Greedy tokens (and log-probabilities, which go through the LM head's all-gather) of tiny
random Llama and Qwen3 checkpoints with 2 ranks equal one process's; so do SmolLM2's
(dequantized) with 3 ranks. The lifecycle is checked the way a user meets it: a killed
worker ends the run with a :class:`WorkerError` naming it, and closing, garbage
collection, Ctrl-C, the driver's death and a failed start leave no process and no
shared-memory segment behind. Tests marked slow start real processes over gloo.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from dist_workers import (  # noqa: F401 - dev_shm_to_ourselves is a fixture
    child_pids,
    dev_shm_to_ourselves,
    free_port,
    no_new_shared_memory,
    running,
    shared_memory,
)
from fake_hw import make_numa_tree
from tiny_llama import random_prompts, write_tiny_llama
from transformers import LlamaConfig, Qwen3Config, Qwen3ForCausalLM

import hwplug
from hwplug.errors import ConfigError, WorkerError

GREEDY = hwplug.SamplingParams(max_tokens=12, logprobs=2, prompt_logprobs=1)
LONG = hwplug.SamplingParams(max_tokens=400, ignore_eos=True)
#: fp32 log-probabilities of 2 ranks vs one process (the all-reduce sums in another order)
LOGPROB_ATOL = 1e-4
#: A driver that generates until it is interrupted; prints its workers' pids first.
# Ctrl-C raises KeyboardInterrupt as in a terminal: a shell's background job (a CI runner)
# starts with SIGINT ignored, and Python then installs no handler of its own.
DRIVER_SCRIPT = """
import json, multiprocessing, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import hwplug
llm = hwplug.LLM(sys.argv[1], num_kv_blocks=64, tensor_parallel_size=2)
print(json.dumps([p.pid for p in multiprocessing.active_children()]), flush=True)
while True:
    llm.generate([[1000 + i] * 8 for i in range(4)],
                 hwplug.SamplingParams(max_tokens=400, ignore_eos=True))
"""


def write_tiny_qwen3(directory: Path) -> Path:
    """The tiny Llama's tokenizer and sizes as a Qwen3 (q/k norms, head_dim 16)."""
    write_tiny_llama(directory)  # the tokenizer files; the weights are replaced below
    sizes = LlamaConfig.from_pretrained(directory).to_dict()
    config = Qwen3Config(**{key: sizes[key] for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
        "tie_word_embeddings", "bos_token_id", "eos_token_id")},
        head_dim=16, architectures=["Qwen3ForCausalLM"])
    model = Qwen3ForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.3, generator=generator)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def tensor_parallel_workers() -> list[int]:
    """Pids of this process's tensor-parallel workers."""
    return [p.pid for p in multiprocessing.active_children() if "tensor-parallel" in p.name]


def summary(outputs: list[hwplug.Output]) -> list[tuple[list[int], torch.Tensor]]:
    """Per output: its tokens, and the log-probabilities of its sampled tokens then of its
    prompt tokens (after the first)."""
    return [(o.token_ids, torch.tensor(
        [row[token].logprob for row, token in zip(o.outputs[0].logprobs, o.token_ids,
                                                  strict=True)]
        + [row[token].logprob for row, token in zip(o.prompt_logprobs[1:],
                                                    o.prompt_token_ids[1:], strict=True)]))
            for o in outputs]


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_two_ranks_generate_what_one_process_does_and_leave_nothing_behind(
        architecture, llama_dir, tmp_path):
    model_dir = llama_dir if architecture == "llama" else write_tiny_qwen3(tmp_path / "qwen3")
    prompts = random_prompts(seed=3, count=6)
    alone = hwplug.LLM(model_dir, num_kv_blocks=64)
    want = summary(alone.generate(prompts, GREEDY))
    alone.close()
    before, shm = child_pids(), shared_memory()

    llm = hwplug.LLM(model_dir, num_kv_blocks=64, tensor_parallel_size=2)
    (worker,) = tensor_parallel_workers()
    assert llm.parallelism.describe() == "tensor-parallel 2"
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(
            summary(llm.generate(prompts, GREEDY)), want, strict=True):
        assert tokens == want_tokens
        torch.testing.assert_close(logprobs, want_logprobs, atol=LOGPROB_ATOL, rtol=0)
    del llm  # garbage collection closes it: the worker is stopped and reaped
    gc.collect()
    assert not running(worker)
    assert child_pids() <= before and no_new_shared_memory(shm)


@pytest.mark.slow
def test_three_ranks_of_smollm2_generate_what_one_process_does():
    """9 query heads and 3 KV heads over 3 ranks; GGUF blocks cannot be split, so the
    weights are dequantized (fp32)."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = hwplug.SamplingParams(max_tokens=8)
    alone = hwplug.LLM(dequantize=True, dtype="float32", num_kv_blocks=32)
    want = [o.token_ids for o in alone.generate(prompts, params)]
    alone.close()
    llm = hwplug.LLM(dequantize=True, dtype="float32", num_kv_blocks=32,
                     tensor_parallel_size=3)
    workers = tensor_parallel_workers()
    assert len(workers) == 2
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    llm.close()
    assert not any(map(running, workers))


@pytest.mark.slow
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_killing_a_worker_mid_generation_fails_the_requests_with_a_worker_error(llama_dir):
    before, shm = child_pids(), shared_memory()
    llm = hwplug.LLM(llama_dir, num_kv_blocks=64, tensor_parallel_size=2)
    (worker,) = tensor_parallel_workers()
    first, second = (llm.stream(prompt, LONG) for prompt in random_prompts(seed=4, count=2))
    pieces = iter(first)
    next(pieces)  # both requests are in flight
    os.kill(worker, signal.SIGKILL)
    named = rf"tensor-parallel rank 1 \(pid {worker}\) was killed by signal SIGKILL"
    for stream in (pieces, iter(second)):
        with pytest.raises(WorkerError, match=named) as caught:
            for _ in stream:
                pass
        assert (caught.value.rank, caught.value.pid, caught.value.exitcode) == (
            1, worker, -signal.SIGKILL)
    with pytest.raises(WorkerError, match=named):  # and so does every later request
        llm.generate([1000, 1001])
    assert child_pids() <= before  # reaped by the driver before the error was raised
    llm.close()
    assert no_new_shared_memory(shm)


@pytest.mark.slow
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_a_failed_start_raises_its_error_and_stops_every_worker(llama_dir):
    before, shm = child_pids(), shared_memory()
    with pytest.raises(ConfigError, match=r"attention heads \(4\) does not split evenly over "
                                          "3 tensor-parallel ranks"):
        hwplug.LLM(llama_dir, num_kv_blocks=64, tensor_parallel_size=3)
    assert child_pids() <= before and no_new_shared_memory(shm)


@pytest.mark.slow
def test_a_rank_that_dies_at_start_is_a_worker_error_within_the_rendezvous_timeout(llama_dir):
    before, killed = child_pids(), []

    def kill_the_worker() -> None:
        if wait_until(tensor_parallel_workers, 60):
            killed.append(tensor_parallel_workers()[0])
            os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"tensor-parallel rank 1 \(pid \d+\) was killed by "
                                          "signal SIGKILL") as caught:
        hwplug.LLM(llama_dir, num_kv_blocks=64, tensor_parallel_size=2, rendezvous_timeout_s=3)
    elapsed = time.monotonic() - started
    killer.join()
    assert (caught.value.rank, caught.value.pid) == (1, killed[0])
    assert elapsed < 60, elapsed  # the driver's own start plus 3 s, not COLLECTIVE_TIMEOUT
    assert child_pids() <= before


def test_a_torchrun_rank_whose_peers_never_join_is_a_worker_error(llama_dir, monkeypatch):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port()),
                        "HWPLUG_RENDEZVOUS_TIMEOUT_S": "1.5"}.items():
        monkeypatch.setenv(name, value)
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"tensor-parallel rank 0 of 2: the other ranks did "
                                          r"not join at 127\.0\.0\.1:\d+ within 1\.5 s"):
        hwplug.LLM(llama_dir, tensor_parallel_size=2)
    assert time.monotonic() - started < 30
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
@pytest.mark.usefixtures("dev_shm_to_ourselves")  # it counts /dev/shm
def test_ctrl_c_stops_the_driver_and_its_workers(llama_dir, tmp_path):
    shm = shared_memory()
    driver = subprocess.Popen([sys.executable, "-c", DRIVER_SCRIPT, str(llama_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    workers = json.loads(driver.stdout.readline())
    assert len(workers) == 1 and running(workers[0])
    time.sleep(1.0)  # generating
    os.killpg(driver.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
    try:
        _, stderr = driver.communicate(timeout=120)
    finally:  # nothing outlives a failure either
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    assert "KeyboardInterrupt" in stderr
    assert not running(workers[0]) and no_new_shared_memory(shm)


@pytest.mark.slow
def test_workers_exit_when_their_driver_dies(llama_dir):
    driver = subprocess.Popen([sys.executable, "-c", DRIVER_SCRIPT, str(llama_dir)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    workers = json.loads(driver.stdout.readline())
    time.sleep(1.0)
    driver.kill()
    driver.wait(timeout=30)
    assert wait_until(lambda: not any(map(running, workers)), seconds=60)


@pytest.mark.slow
def test_torchrun_ranks_join_and_rank_0_gets_the_tokens(llama_dir, tmp_path):
    prompts = random_prompts(seed=5, count=3)
    params = hwplug.SamplingParams(max_tokens=12)
    alone = hwplug.LLM(llama_dir, num_kv_blocks=64)
    want = [o.token_ids for o in alone.generate(prompts, params)]
    alone.close()
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import hwplug
        from hwplug.errors import ConfigError
        llm = hwplug.LLM(sys.argv[1], num_kv_blocks=64, tensor_parallel_size=2)
        if llm.parallelism.is_worker:  # rank 1 served rank 0 until it closed
            try:
                llm.generate([[1000, 1001]])
            except ConfigError as error:
                print("rank 1:", error, flush=True)
        else:
            outputs = llm.generate(json.loads(sys.argv[2]), hwplug.SamplingParams(max_tokens=12))
            print("tokens:", json.dumps([o.token_ids for o in outputs]), flush=True)
            llm.close()
    """))
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script),
         str(llama_dir), json.dumps(prompts)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    (tokens,) = [line.removeprefix("tokens: ") for line in lines if line.startswith("tokens:")]
    assert json.loads(tokens) == want
    assert ("rank 1: generate() is not available on tensor-parallel rank 1: this rank served "
            "rank 0, and outputs come back on rank 0") in lines


@pytest.mark.slow
def test_cli_generate_with_two_ranks_prints_what_one_process_does(llama_dir):
    prompt = "the quick brown fox"
    alone = hwplug.LLM(llama_dir, num_kv_blocks=64)
    want = alone.generate(prompt, hwplug.SamplingParams(max_tokens=8))[0].text
    alone.close()
    out = subprocess.run([sys.executable, "-m", "hwplug", "generate", prompt, "--model",
                          str(llama_dir), "--max-tokens", "8", "--tensor-parallel-size", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.removesuffix("\n") == want
    assert ", tensor-parallel 2; kernels:" in out.stderr


@pytest.mark.slow
def test_info_shows_the_cpu_binding_plan_of_the_configured_ranks(tmp_path):
    make_numa_tree(tmp_path, ["0-3,8-11", "4-7,12-15"])
    out = subprocess.run([sys.executable, "-m", "hwplug", "info", "--json",
                          "--tensor-parallel-size", "4"], capture_output=True, text=True,
                         env={**os.environ, "HWPLUG_PROBE_ROOT": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cpu_binding"] == {
        "setting": "auto", "ranks": 4, "nodes": {"0": "0-3,8-11", "1": "4-7,12-15"},
        # two ranks per node, each an even share of its node's CPUs
        "plan": ["rank 0: cpus 0-3", "rank 1: cpus 8-11", "rank 2: cpus 4-7",
                 "rank 3: cpus 12-15"]}


@pytest.mark.parametrize("options, message", [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1, got 0"),
    ({"data_parallel_size": 1.5}, "data_parallel_size must be an integer >= 1, got 1.5"),
    ({"tensor_parallel_size": 2, "data_parallel_size": 2},
     "tensor_parallel_size and data_parallel_size > 1 together are not supported"),
    ({"tensor_parallel_size": 2, "kv_connector": "shared_storage"},
     "kv_connector needs one engine process"),
    ({"data_parallel_size": 2, "kv_events_endpoint": "tcp://127.0.0.1:5557"},
     "kv_events_endpoint is not supported with data_parallel_size > 1"),
])
def test_invalid_parallel_options_are_config_errors_before_any_process_starts(
        llama_dir, options, message):
    before = child_pids()
    with pytest.raises(ConfigError, match=message):
        hwplug.LLM(llama_dir, **options)
    assert child_pids() <= before


def test_under_torchrun_the_world_size_must_be_the_tensor_parallel_size(llama_dir,
                                                                        monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with pytest.raises(ConfigError, match="launched by torchrun with WORLD_SIZE=2, but "
                                          "tensor_parallel_size is 1: they must be equal"):
        hwplug.LLM(llama_dir)


@pytest.mark.slow
def test_a_failed_join_earlier_in_the_driver_does_not_stall_tensor_parallelism(llama_dir):
    """torch numbers a process's groups with a counter that a failed join leaves raised; the
    driver's group must still meet its fresh workers' (they once waited on other keys)."""
    import torch.distributed as dist

    with pytest.raises(RuntimeError):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                                world_size=2, timeout=timedelta(seconds=1))
    prompts = random_prompts(seed=4, count=2)
    alone = hwplug.LLM(llama_dir, num_kv_blocks=32)
    want = [o.token_ids for o in alone.generate(prompts, GREEDY)]
    alone.close()
    llm = hwplug.LLM(llama_dir, num_kv_blocks=32, tensor_parallel_size=2,
                     rendezvous_timeout_s=30)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == want
    llm.close()
