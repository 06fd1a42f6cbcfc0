"""Prefill steps compiled per (tokens, sequences) bucket on the tpu platform (issue 28, TPU
item 2): greedy output equals the op-by-op engine's, on the tiny random Llama of
``tests/tiny_llama.py``, with prompts of several lengths batched and chunked (mixed
prefill and decode steps); a bucket compiles once; the step crosses only its inputs and
its token ids.
"""

from __future__ import annotations

import jax
import pytest
from tiny_llama import random_prompts, tiny_model_dir  # noqa: F401 (fixture)

import hwplug
from hwplug import discovery
from hwplug_tpu.bridge import TRANSFERS
from hwplug_tpu.compilations import compilations

GREEDY = hwplug.SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(model_dir):
    """The compiled engine (step graphs) and the op-by-op one, chunking prompts at 32
    tokens."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JAX_PLATFORMS", "cpu")
        env.setenv("HWPLUG_PLATFORM", "tpu")
        discovery.reset()
        made = [hwplug.LLM(model_dir, dtype="float32", max_num_seqs=4, max_model_len=96,
                           max_num_batched_tokens=32, step_graphs=graphs)
                for graphs in (True, False)]
        try:
            yield made
        finally:
            for engine in made:
                engine.close()
            discovery.reset()


def tokens(engine: hwplug.LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in engine.generate(prompts, GREEDY)]


def test_compiled_prefill_gives_the_op_by_op_greedy_tokens(engines):
    compiled, op_by_op = engines
    prompts = random_prompts(5, 3) + random_prompts(1, 1, 40)  # 40 tokens: two chunks
    assert tokens(compiled, prompts) == tokens(op_by_op, prompts)
    graphs = compiled.runner.prefill_graphs
    assert graphs.replays > 0 and not graphs.refused, graphs.describe()
    assert op_by_op.runner.prefill_graphs is None


def test_a_prefill_bucket_compiles_once_and_sends_back_only_token_ids(engines):
    """After a first run of its shapes, a prefill step of 3 prompts (12 tokens: bucket
    (16, 4)), driven on this thread (JAX's transfer guard is per thread; the engine's loop
    is idle), compiles nothing and brings back one array, its bucket's 4 int32 token ids."""
    engine = engines[0].engine
    graphs = engines[0].runner.prefill_graphs
    tokens(engines[0], random_prompts(3, 3, 4))
    counter, recorded, before = compilations().count, graphs.recorded, graphs.replays
    for seed in (4, 5):
        for i, prompt in enumerate(random_prompts(seed, 3, 4)):
            engine.add_request(f"guarded-{seed}-{i}", prompt, GREEDY)
        TRANSFERS.reset()
        with jax.transfer_guard("disallow"):
            engine.step()
        assert (TRANSFERS.to_host, TRANSFERS.to_host_bytes) == (1, 4 * 4)
        engine.abort_all()
    assert compilations().count == counter
    assert graphs.recorded == recorded and (16, 4) in recorded
    assert graphs.replays == before + 2
