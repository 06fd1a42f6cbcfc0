"""An engine on the tpu platform keeps its weights and KV caches on the JAX device, and a
decode step runs as one compiled JAX function per batch bucket, crossing only its inputs
and its logits, or, sampling on the device, only its inputs and its token ids.

JAX's CPU backend stands in for the TPU with two devices (see ``conftest.py``): the
platform computes on the second, so every crossing between torch's host memory and the
device is a transfer JAX's transfer guard sees. SmolLM2 (the packaged model) in float32,
a short context. The decode steps are driven through the runner's step graphs directly,
on this thread (JAX's transfer guard is per thread; the engine's loop runs on another).
"""

from __future__ import annotations

import jax
import pytest
import torch

import hwplug
from hwplug import discovery
from hwplug.attention import AttentionMetadata
from hwplug.model_zoo.engine.model_runner import StepInputs, slot
from hwplug.model_zoo.sampling import StructuredOutput
from hwplug.step_replay import SampleRequest
from hwplug_tpu.bridge import TRANSFERS, device, is_cache, resident
from hwplug_tpu.compilations import compilations
from hwplug_tpu.step import RECORDER

pytestmark = pytest.mark.slow  # loads the real model


@pytest.fixture(scope="module")
def llm():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("JAX_PLATFORMS", "cpu")
        env.setenv("HWPLUG_PLATFORM", "tpu")
        discovery.reset()
        engine = hwplug.LLM(None, dtype="float32", max_num_seqs=4, max_model_len=64,
                            dequantize=True)
        try:
            yield engine
        finally:
            engine.close()
            discovery.reset()


def step_of(llm, tokens: list[int], length: int) -> tuple[list, list, list, list]:
    """A decode step of ``len(tokens)`` sequences of ``length`` tokens (sequence i in
    blocks of its own), as (tokens, positions, slots, block tables)."""
    size = llm.runner.block_size
    blocks = -(-length // size)
    tables = [[i * blocks + j for j in range(blocks)] for i in range(len(tokens))]
    position = length - 1
    return tokens, [position] * len(tokens), [slot(t, position, size) for t in tables], tables


def replayed(llm, tokens: list[int], length: int) -> torch.Tensor:
    """The step's logits from its bucket's graph (a bucket's first step only counts towards
    its recording: the engine runs it eagerly)."""
    graphs, step = llm.runner.graphs, step_of(llm, tokens, length)
    logits = graphs.logits(*step)
    if logits is None and not graphs.refused:
        logits = graphs.logits(*step)
    assert logits is not None, llm.runner.graphs.refused
    return logits.clone()


def eager(llm, tokens: list[int], length: int) -> torch.Tensor:
    """The same step op by op (each op a jitted JAX function, activations crossing)."""
    ids, positions, slots, tables = step_of(llm, tokens, length)
    n = len(ids)
    metadata = AttentionMetadata(
        torch.tensor(slots), torch.tensor(tables, dtype=torch.int32),
        torch.full((n,), length, dtype=torch.int32), torch.arange(n + 1, dtype=torch.int32),
        1, length)
    inputs = StepInputs(torch.tensor(ids), torch.tensor(positions), metadata, None)
    with torch.inference_mode():
        return llm.runner.model.compute_logits(llm.runner.forward(inputs))


def test_weights_and_kv_caches_live_on_the_second_jax_device(llm):
    second = jax.devices("cpu")[1]  # conftest asks JAX for two CPU devices
    assert device() == second
    model = llm.runner.model
    tensors = [*model.parameters(), *model.buffers()]
    assert tensors and all(resident(t).devices() == {second} for t in tensors)
    caches = llm.runner.kv_caches
    assert all(is_cache(c) and resident(c).devices() == {second}
               for c in caches)


@pytest.mark.parametrize("guard", ["disallow", "disallow_explicit"])
def test_a_decode_step_crosses_only_its_inputs_and_logits(llm, guard):
    """Past the first replay (which compiles), a step under JAX's transfer guard: no
    transfer, implicit or (``disallow_explicit``) explicit, besides the step's declared
    inputs and outputs; the weights are the arrays placed once, the caches were updated
    on the device; the logits are those of the same step run op by op."""
    replayed(llm, [11, 12], 20)
    weights = [resident(t) for t in llm.runner.model.parameters()]
    caches = [resident(c) for c in llm.runner.kv_caches]
    with jax.transfer_guard(guard):
        logits = replayed(llm, [13, 14], 21)
    assert all(resident(t) is w for t, w in zip(llm.runner.model.parameters(), weights,
                                                     strict=True))
    assert all(resident(c) is not old for c, old in zip(llm.runner.kv_caches, caches,
                                                              strict=True))
    torch.testing.assert_close(logits, eager(llm, [13, 14], 21), atol=2e-4, rtol=2e-4)


def test_the_guard_catches_a_step_run_op_by_op(llm):
    """The control: the same step op by op transfers its activations at every op."""
    with jax.transfer_guard("disallow_explicit"), pytest.raises(Exception, match="ransfer"):
        eager(llm, [13, 14], 21)


def test_one_compilation_per_batch_bucket(llm):
    """Batches of 3 and 4 sequences share the bucket of 4: it is compiled once, at its
    first replay, and no later step of it compiles anything."""
    counter, compiled = compilations(), len(RECORDER.compiled)
    replayed(llm, [1, 2, 3], 10)
    assert len(RECORDER.compiled) == compiled + 1
    assert 4 in llm.runner.graphs.recorded
    before = counter.count
    for length in range(11, 40, 7):
        replayed(llm, [4, 5, 6], length)
    replayed(llm, [7, 8, 9, 10], 12)
    assert counter.count == before
    assert len(RECORDER.compiled) == compiled + 1
    assert "steps compiled whole" in hwplug.current_platform().execution_summary()


def test_with_a_kv_connector_the_caches_stay_in_torch(llm, tmp_path):
    """A KV connector moves blocks of the torch caches: an engine with one keeps its caches
    there (its weights still on the device), writes them op by op (a recording refuses a
    cache it cannot carry), and generates the resident engine's greedy tokens."""
    def tokens(engine: hwplug.LLM) -> list[int]:
        (out,) = engine.generate(["The capital of France is"],
                                 hwplug.SamplingParams(max_tokens=4, ignore_eos=True))
        return out.outputs[0].token_ids

    other = hwplug.LLM(None, dtype="float32", max_num_seqs=4, max_model_len=64,
                       dequantize=True, kv_connector="shared_storage",
                       kv_connector_config={"path": str(tmp_path)})
    try:
        assert not any(is_cache(c) for c in other.runner.kv_caches)
        assert all(resident(t) is not None for t in other.runner.model.parameters())
        assert tokens(other) == tokens(llm)
        assert all(c.any() for c in other.runner.kv_caches)
        assert "did not place" in " ".join(other.runner.graphs.refused.values())
    finally:
        other.close()


def test_a_sampled_decode_step_sends_back_only_its_token_ids(llm):
    """A replayed decode step samples inside its compiled program: past its first run
    (which compiles), under JAX's transfer guard, one array comes back, the bucket's int32
    token ids, which are the greedy tokens of the same step run op by op; a request for
    log-probabilities brings back those too, and nothing else."""
    graphs = llm.runner.graphs
    greedy = SampleRequest([0.0] * 2, [0] * 2, [1.0] * 2, [0] * 2, [21, 21])
    graphs.sample(*step_of(llm, [11, 12], 20), greedy)
    TRANSFERS.reset()
    with jax.transfer_guard("disallow"):
        sampled = graphs.sample(*step_of(llm, [13, 14], 21), greedy)
    assert (TRANSFERS.to_host, TRANSFERS.to_host_bytes) == (1, 2 * 4)  # bucket 2, int32
    assert sampled.tokens == eager(llm, [13, 14], 21).argmax(dim=-1).tolist()
    assert sampled.logprobs is None
    asked = SampleRequest([0.0] * 2, [0] * 2, [1.0] * 2, [0] * 2, [21, 21], logprobs=2)
    graphs.sample(*step_of(llm, [13, 14], 21), asked)
    TRANSFERS.reset()
    with jax.transfer_guard("disallow"):
        again = graphs.sample(*step_of(llm, [13, 14], 21), asked)
    assert TRANSFERS.to_host == 5  # tokens, their log-probabilities and ranks, the top 2
    assert again.tokens == sampled.tokens and len(again.logprobs[2][0]) == 2


def test_the_engine_samples_on_the_device_and_falls_back_for_a_penalty(llm):
    """Greedy generation samples every step on the device (the prefill's and the decode
    steps'); a repetition penalty or structured output, which the device sampler does not
    apply, samples on the host, counted by reason."""
    sampling = llm.runner.device_sampling
    before, host = sampling.device_steps, sampling.host_steps["repetition penalty"]
    llm.generate(["The capital of France is"],
                 hwplug.SamplingParams(max_tokens=4, ignore_eos=True))
    assert sampling.device_steps == before + 4
    llm.generate(["The capital of France is"],
                 hwplug.SamplingParams(max_tokens=4, ignore_eos=True, repetition_penalty=1.2))
    assert sampling.device_steps == before + 4
    assert sampling.host_steps["repetition penalty"] == host + 4
    assert "repetition penalty: " in sampling.describe()
    # structured output masks the logits on the host: its steps sample there too
    (out,) = llm.generate(["Reply with a digit:"], hwplug.SamplingParams(
        max_tokens=3, structured=StructuredOutput(regex="[0-9]{3}")))
    assert out.outputs[0].text.isdigit() and sampling.host_steps["structured output"] > 0
    assert sampling.device_steps == before + 4


def test_a_seeded_request_samples_the_same_tokens_whatever_its_neighbours(llm):
    """Its draws derive from its seed and positions only: alone, or batched with other
    prompts (its decode steps then replay another bucket), the same tokens."""
    seeded = hwplug.SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.0,
                                   top_p=0.9, seed=1234)
    prompt = "Once upon a time"
    (alone,) = llm.generate([prompt], seeded)
    batched = llm.generate([prompt, "The weather today", "Numbers: 1, 2,"], seeded)
    other = llm.generate([prompt], hwplug.SamplingParams(
        max_tokens=6, ignore_eos=True, temperature=1.0, top_p=0.9, seed=1235))
    assert batched[0].outputs[0].token_ids == alone.outputs[0].token_ids
    assert other[0].outputs[0].token_ids != alone.outputs[0].token_ids


def test_compiled_prefill_gives_the_eager_prefills_greedy_tokens(llm):
    """Prefill steps compiled per (tokens, sequences) bucket: SmolLM2's greedy tokens are
    those of the same engine with its prefill steps run op by op."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a"]
    params = hwplug.SamplingParams(max_tokens=5, ignore_eos=True)
    graphs = llm.runner.prefill_graphs
    before = graphs.replays
    compiled = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    assert graphs.replays > before and not graphs.refused, graphs.describe()
    llm.runner.prefill_graphs = None  # between steps: the engine's loop is idle
    try:
        eager = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
    finally:
        llm.runner.prefill_graphs = graphs
    assert compiled == eager
