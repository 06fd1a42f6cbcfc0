"""One ``hwplug.LLM`` used from several threads, streams read side by side, abandoned streams.

The model is the tiny random Llama of ``tiny_llama.py`` (milliseconds a step), whose
greedy and seeded outputs do not depend on what else is in the batch, so every result is
compared exactly with the same request run alone, sequentially, on the same ``LLM``.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
from pathlib import Path

import pytest
from tiny_llama import random_prompts, tiny_model_dir  # noqa: F401 (fixture)

import hwplug
from hwplug.errors import EngineStoppedError, RequestAbortedError

#: RSS may grow at most this much over 200 generate() calls after a warm-up of 20 (a leak
#: of one request's state per call, e.g. its tokens and handle, would exceed it with the
#: allocator's slack; measured growth here is well under 1 MiB).
RSS_GROWTH_BOUND = 8 * 2**20
THREADS = 4
GREEDY = hwplug.SamplingParams(max_tokens=8, ignore_eos=True)
SEEDED = hwplug.SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.8, top_p=0.9,
                               seed=11)
prompts = random_prompts


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> hwplug.LLM:
    return hwplug.LLM(model_dir, num_kv_blocks=256)


def wait_idle(llm: hwplug.LLM) -> None:
    assert llm._loop.wait_until_idle(timeout=30)
    manager = llm.block_manager
    assert manager.num_free_blocks == manager.num_blocks


def test_four_threads_get_their_own_exact_outputs_batched_together(llm):
    work = {thread: prompts(thread, 6) for thread in range(THREADS)}
    params = [GREEDY, SEEDED]
    expected = {thread: [llm.generate([prompt], params[i % 2])[0].token_ids
                         for i, prompt in enumerate(batch)] for thread, batch in work.items()}
    steps_alone = llm.engine.num_steps
    got: dict[int, list[list[int]]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(thread: int) -> None:
        try:
            start.wait()
            got[thread] = [llm.generate([prompt], params[i % 2])[0].token_ids
                           for i, prompt in enumerate(work[thread])]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert got == expected
    # requests of different threads shared steps: fewer steps than running them one by one
    assert llm.engine.num_steps - steps_alone < steps_alone * 3 // 4
    wait_idle(llm)


def test_interleaved_streams_each_equal_their_output(llm):
    first, second = prompts(1, 2)
    streams = [llm.stream(first, GREEDY), llm.stream(second, SEEDED)]
    pieces: list[list[str]] = [[], []]
    for a, b in itertools.zip_longest(*map(iter, streams)):
        pieces[0].append(a or "")
        pieces[1].append(b or "")
    for stream, parts, prompt, params in zip(streams, pieces, (first, second),
                                             (GREEDY, SEEDED), strict=True):
        assert "".join(parts) == stream.output.text
        assert stream.output.token_ids == llm.generate([prompt], params)[0].token_ids
    wait_idle(llm)


def test_a_stream_read_while_generate_runs_in_another_thread(llm):
    streamed, batch = prompts(2, 1)[0], prompts(3, 8)
    expected = [o.token_ids for o in llm.generate(batch, GREEDY)]
    results: dict[str, list[list[int]]] = {}
    thread = threading.Thread(target=lambda: results.setdefault(
        "generate", [o.token_ids for o in llm.generate(batch, GREEDY)]))
    stream = llm.stream(streamed, hwplug.SamplingParams(max_tokens=24, ignore_eos=True))
    thread.start()
    text = "".join(stream)
    thread.join(timeout=60)
    assert text == stream.output.text and len(stream.output.token_ids) == 24
    assert results["generate"] == expected
    wait_idle(llm)


def test_an_abandoned_stream_frees_its_request_and_blocks(llm):
    stream = llm.stream(prompts(4, 1)[0], hwplug.SamplingParams(max_tokens=200,
                                                                ignore_eos=True))
    pieces = iter(stream)
    next(pieces)
    del pieces, stream
    gc.collect()
    wait_idle(llm)
    never_read = llm.stream(prompts(5, 1)[0], hwplug.SamplingParams(max_tokens=200,
                                                                    ignore_eos=True))
    del never_read
    gc.collect()
    wait_idle(llm)


def test_a_closed_stream_is_aborted_and_says_so(llm):
    with llm.stream(prompts(6, 1)[0], hwplug.SamplingParams(max_tokens=200,
                                                            ignore_eos=True)) as stream:
        next(iter(stream))
    wait_idle(llm)
    assert stream.output is None
    with pytest.raises(RequestAbortedError, match="aborted"):
        list(stream)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")
def test_repeated_generate_does_not_grow_memory(llm):
    batch = prompts(7, 2)
    params = hwplug.SamplingParams(max_tokens=4, ignore_eos=True, logprobs=2)
    for _ in range(20):
        llm.generate(batch, params)
    gc.collect()
    before = rss_bytes()
    for _ in range(200):
        llm.generate(batch, params)
    gc.collect()
    growth = rss_bytes() - before
    assert growth < RSS_GROWTH_BOUND, f"RSS grew {growth / 2**20:.1f} MiB over 200 calls"
    wait_idle(llm)


def test_a_closed_llm_refuses_new_requests(model_dir):
    llm = hwplug.LLM(model_dir, num_kv_blocks=16)
    assert llm.generate([[1000, 1001]], GREEDY)[0].token_ids
    llm.close()
    with pytest.raises(EngineStoppedError, match="shut down"):
        llm.generate([[1000, 1001]], GREEDY)
