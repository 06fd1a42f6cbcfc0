"""``AsyncLLM``: the engine driven from asyncio, one update per step per request.

On the tiny random Llama of ``tiny_llama.py``, whose greedy and seeded outputs do not
depend on the batch: each request's streamed updates (text, tokens, log-probabilities,
finish) add up to its final output and to what ``LLM.generate`` gives alone; requests of
many coroutines share steps; an abort frees the request's KV blocks; the engine's stats
show the load and prefix-cache hits.
"""

from __future__ import annotations

import asyncio

import pytest
from tiny_llama import random_prompts, tiny_model_dir  # noqa: F401 (fixture)

import hwplug
from hwplug.errors import ModelError, RequestAbortedError
from hwplug.model_zoo.async_llm import AsyncLLM

SEEDED = hwplug.SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.8, seed=3, n=2,
                               logprobs=2)
GREEDY = hwplug.SamplingParams(max_tokens=8, ignore_eos=True)
LONG = hwplug.SamplingParams(max_tokens=400, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(model_dir) -> hwplug.LLM:
    llm = hwplug.LLM(model_dir, num_kv_blocks=256)
    yield llm
    llm.close()


def idle(llm: hwplug.LLM) -> bool:
    return llm._loop.wait_until_idle(timeout=30) and llm.engine.stats().kv_blocks_used == 0


def test_updates_add_up_to_the_output_and_to_generate(llm):
    prompts = random_prompts(1, 2)

    async def run():
        request = AsyncLLM(llm).submit(prompts, SEEDED)
        return [update async for update in request.updates()], request.outputs

    updates, outputs = asyncio.run(run())
    for index, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        assert output.token_ids == llm.generate([prompt], SEEDED)[0].token_ids
        for completion in output.outputs:
            samples = [sample for i, update in updates if i == index
                       for sample in update.samples if sample.index == completion.index]
            assert [t for s in samples for t in s.token_ids] == completion.token_ids
            assert "".join(s.text for s in samples) == completion.text
            assert [row for s in samples for row in s.logprobs] == completion.logprobs
            assert [s.finish_reason for s in samples][-1] == "length"
            assert all(s.finish_reason is None for s in samples[:-1])
    assert idle(llm)


def test_many_coroutines_share_steps_and_get_their_own_outputs(llm):
    prompts = random_prompts(2, 8)
    alone = [llm.generate([prompt], GREEDY)[0].token_ids for prompt in prompts]
    steps = llm.engine.num_steps

    async def run():
        front = AsyncLLM(llm)
        return await asyncio.gather(*(front.submit([p], GREEDY).result() for p in prompts))

    results = asyncio.run(run())
    assert [outputs[0].token_ids for outputs in results] == alone
    assert llm.engine.num_steps - steps < len(prompts) * GREEDY.max_tokens
    assert idle(llm)


def test_an_abort_frees_the_blocks_and_ends_the_updates(llm):
    async def run():
        request = AsyncLLM(llm).submit(random_prompts(3, 1), LONG)
        updates = request.updates()
        await updates.__anext__()
        busy = llm.engine.stats()
        request.abort()
        with pytest.raises(RequestAbortedError):
            async for _ in updates:
                pass
        return busy

    busy = asyncio.run(run())
    assert busy.kv_blocks_used > 0 and busy.num_running == 1
    assert idle(llm)


def test_leaving_the_updates_early_aborts_the_request(llm):
    async def run():
        request = AsyncLLM(llm).submit(random_prompts(4, 1), LONG)
        async for _ in request.updates():
            break  # asyncio.run closes the abandoned generator, which aborts
        return request

    request = asyncio.run(run())
    assert idle(llm)
    assert request.outputs == [None]


def test_a_bad_prompt_aborts_the_prompts_started_with_it(llm):
    good, = random_prompts(5, 1)

    async def run():
        AsyncLLM(llm).submit([good, [10**9]], GREEDY)

    with pytest.raises(ModelError, match="vocabulary"):
        asyncio.run(run())
    assert idle(llm)


def test_stats_count_prefix_cache_hits(llm):
    prompt, = random_prompts(6, 1, length=64)
    before = llm.engine.stats()
    llm.generate([prompt, prompt], GREEDY)
    llm.generate([prompt], GREEDY)
    after = llm.engine.stats()
    assert after.prefix_queried_tokens - before.prefix_queried_tokens == 3 * 64
    assert after.prefix_hit_tokens > before.prefix_hit_tokens  # the last call's
    assert after.kv_blocks_total == 256


def test_the_event_loop_is_woken_once_per_engine_step_not_per_request(llm):
    """The engine thread wakes the event loop (``call_soon_threadsafe``) at most once per
    step, however many of the loop's requests the step advanced."""
    prompts = random_prompts(9, 8)

    async def run():
        event_loop = asyncio.get_running_loop()
        wakes = 0
        original = event_loop.call_soon_threadsafe

        def counted(*args, **kwargs):
            nonlocal wakes
            wakes += 1
            return original(*args, **kwargs)

        event_loop.call_soon_threadsafe = counted
        front = AsyncLLM(llm)
        before = llm.engine.stats().num_steps
        requests = [front.submit(prompts[i:i + 2], GREEDY) for i in range(0, 8, 2)]
        outputs = await asyncio.gather(*(request.result() for request in requests))
        return wakes, llm.engine.stats().num_steps - before, outputs

    wakes, steps, outputs = asyncio.run(run())
    got = [output.token_ids for pair in outputs for output in pair]
    assert got == [output.token_ids for output in llm.generate(prompts, GREEDY)]
    # 8 prompts of 8 tokens: 64 updates in all, in a handful of shared steps
    assert steps < 16 and 1 <= wakes <= steps
    assert idle(llm)
