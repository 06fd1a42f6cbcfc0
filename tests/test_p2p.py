"""Disaggregated prefill/decode: two engine processes joined by the ``p2p`` connector (gloo).

The producer prefills (``max_tokens=1``), the consumer pulls those KV blocks and decodes;
its greedy tokens must equal one plain engine's, also when the consumer's loads start
late, with step graphs on and off. Then the faults: the layouts of the two
sides disagree (both refuse before any block moves), and the producer dies in the middle
of a transfer, under each failure policy. The consumer's second ``generate`` shows the
engine keeps serving once its peer is gone.
"""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path

import p2p_worker
import pytest
from dist_workers import dev_shm_to_ourselves  # noqa: F401 - a fixture
from tiny_llama import plain_tokens, random_prompts, tiny_model_dir  # noqa: F401 (fixture)

# two fresh processes per test; their queues and events name semaphores in /dev/shm
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("dev_shm_to_ourselves")]
PROMPTS = random_prompts(0, 2, length=70)  # 4 full blocks of 16 each


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return PROMPTS


@pytest.fixture(scope="module")
def expected(model_dir) -> list[list[int]]:
    return plain_tokens(model_dir, PROMPTS, p2p_worker.DECODE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_pair(model_dir: Path, prompts: list[list[int]], **options) -> dict[str, tuple]:
    context = multiprocessing.get_context("spawn")
    results, prefilled = context.Queue(), context.Event()
    port = free_port()
    processes = [context.Process(target=p2p_worker.run, args=(
        rank, port, str(model_dir), prompts, options, results, prefilled))
        for rank in (0, 1)]
    for process in processes:
        process.start()
    reports = {}
    try:
        while len(reports) < 2 and not (options.get("die") and "consumer" in reports):
            role, *report = results.get(timeout=240)
            reports[role] = tuple(report)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return reports


def test_decode_engine_loads_the_prefill_engines_blocks(model_dir, prompts, expected):
    reports = run_pair(model_dir, prompts)
    kind, tokens, again, loaded, failed = reports["consumer"]
    assert kind == "tokens" and tokens == expected and again == expected
    assert loaded == 2 * 4 and failed == 0


@pytest.mark.parametrize("step_graphs", [True, False], ids=["graphs", "eager"])
def test_a_slow_peer_is_waited_for_with_step_graphs_on_or_off(model_dir, step_graphs):
    # one token left after the load: a decode-shaped step, which must not replay a graph
    prompts = random_prompts(1, 2, length=4 * 16 + 1)
    reports = run_pair(model_dir, prompts, slow=True, step_graphs=step_graphs)
    kind, tokens, again, loaded, failed = reports["consumer"]
    assert kind == "tokens" and tokens == plain_tokens(model_dir, prompts, p2p_worker.DECODE)
    assert loaded == 2 * 4 and failed == 0


def test_different_layouts_are_refused_on_both_sides_before_any_block_moves(model_dir,
                                                                             prompts):
    reports = run_pair(model_dir, prompts, block_size_consumer=8)
    for role in ("producer", "consumer"):
        kind, message = reports[role]
        assert kind == "error" and message.startswith("KVLayoutMismatchError")
        assert "block_size 16 vs 8" in message


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_transfer_broken_mid_way_fails_or_recomputes(model_dir, prompts, expected, policy):
    reports = run_pair(model_dir, prompts, die=True, policy=policy)
    kind, result, again, loaded, failed = reports["consumer"]
    if policy == "fail":
        assert kind == "error" and result.startswith("KVTransferError")
        assert "could not be loaded by connector p2p" in result
    else:
        assert kind == "tokens" and result == expected
    assert failed >= 1 and loaded == 0
    assert again == expected  # the peer is gone: the engine computes by itself
