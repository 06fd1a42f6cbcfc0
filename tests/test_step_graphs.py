"""Step graphs: native kernel calls recorded once and replayed without Python.

The recorder is checked on the CPU platform's C kernels (the portable build, which every
CPU compiles): a replay over new input contents equals the eager ops on them; anything a
replay would not repeat (torch compute, in-place writes, reading a tensor into Python, a
Python value that differs between two recordings) is refused with its name. The engine's
decode graphs are checked on the real SmolLM2 GGUF: greedy tokens and log-probabilities
identical to eager steps, with batches padded to their bucket.
"""

from __future__ import annotations

import logging

import pytest
import torch
from model_harness import InMemoryCheckpoint
from tiny_models import random_state

import hwplug
from hwplug.attention import AttentionMetadata
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.engine.decode_graphs import DecodeGraphs
from hwplug.model_zoo.engine.model_runner import GraphLimits, ModelRunner, StepInputs
from hwplug.platforms.cpu.fused.ops import PORTABLE
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug.platforms.cpu.step_graph import native_call, record, same_calls

EPS = 1e-6


@pytest.fixture(autouse=True, scope="module")
def _portable_built() -> None:
    """The C kernels the recorder is checked on, built (or found built) first."""
    PORTABLE.ensure_built()


def _norm_then_silu(x: torch.Tensor, weight: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    return PORTABLE.silu_and_mul(PORTABLE.rms_norm(x, weight, eps))


def test_a_replay_over_new_inputs_equals_the_eager_ops():
    x, weight = torch.randn(3, 64), torch.randn(64)
    with record() as graph:
        graph.outputs = _norm_then_silu(x, weight)
    assert [call.name for call in graph.calls] == ["hwplug_rms_norm", "hwplug_silu_and_mul"]
    x.copy_(torch.randn(3, 64))  # the static input, refilled
    out = graph.replay()
    assert out is graph.outputs
    torch.testing.assert_close(out, _norm_then_silu(x, weight), rtol=0, atol=0)
    reference = hwplug.ops.silu_and_mul.reference(hwplug.ops.rms_norm.reference(x, weight, EPS))
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_the_graph_keeps_what_it_allocated_alive():
    x, weight = torch.randn(2, 64), torch.randn(64)
    with record() as graph:
        PORTABLE.rms_norm(x, weight, EPS)  # its output is dropped here, kept by the graph
    assert len(graph.tensors) == 1
    graph.replay()
    torch.testing.assert_close(graph.tensors[0], hwplug.ops.rms_norm.reference(x, weight, EPS))


@pytest.mark.parametrize("step, named", [
    (lambda x: x + 1, "add"),
    (lambda x: x.add_(1), "add_"),
    (lambda x: x.__setitem__(0, 1.0), "__setitem__"),
    (lambda x: int(x[0, 0]), "__int__"),
    (lambda x: x.sum().item(), "sum"),
    (lambda x: torch.mul(x, 2, out=torch.empty_like(x)), "mul"),
])
def test_torch_work_in_the_step_is_refused_by_name(step, named):
    x, weight = torch.randn(2, 64), torch.randn(64)
    with pytest.raises(UnsupportedError, match=rf"torch(?:'s | \(){named}\b"):
        with record():
            step(PORTABLE.rms_norm(x, weight, EPS))


def test_views_and_metadata_are_allowed():
    x, weight = torch.randn(4, 64), torch.randn(64)
    with record() as graph:
        halves = PORTABLE.rms_norm(x, weight, EPS).view(2, 2, 64).split(1)
        graph.outputs = (halves[0].reshape(2, 64), x.shape, x.is_contiguous())
    assert graph.outputs[0].data_ptr() == graph.tensors[0].data_ptr()


def test_a_step_without_native_calls_and_nested_recordings_are_refused():
    with pytest.raises(UnsupportedError, match="no native kernel call"):
        with record():
            torch.empty(3)
    with pytest.raises(UnsupportedError, match="do not nest"):
        with record(), record():
            pass


def test_same_calls_maps_allocations_and_catches_a_baked_in_python_value():
    x, weight = torch.randn(2, 64), torch.randn(64)
    recordings = []
    for eps in (EPS, EPS, 1e-3):
        with record() as graph:
            graph.outputs = _norm_then_silu(x, weight, eps)
        recordings.append(graph)
    assert recordings[0].tensors[0].data_ptr() != recordings[1].tensors[0].data_ptr()
    same_calls(recordings[0], recordings[1])  # other buffers, same places: the same calls
    with pytest.raises(UnsupportedError, match=r"native call 0 \(hwplug_rms_norm\) changed .*"
                                               r"argument\(s\) \[9\]"):  # eps
        same_calls(recordings[0], recordings[2])
    with record() as shorter:
        PORTABLE.rms_norm(x, weight, EPS)
    with pytest.raises(UnsupportedError, match="made 2 native calls in one recording and 1 "
                                               "in another: which kernels run depends"):
        same_calls(recordings[0], shorter)


def test_recording_makes_no_call_and_a_failing_call_raises_its_kernels_error_when_replayed():
    x, weight = torch.randn(2, 64), torch.randn(64)
    raised, made = [], []

    def check(status: int) -> None:
        raised.append(status)
        raise UnsupportedError(f"status {status}")

    def kernel() -> int:
        made.append(status[0])
        return status[0]

    status = [1]
    with record() as graph:
        graph.outputs = PORTABLE.rms_norm(x, weight, EPS)
        native_call(kernel, check=check)
    assert made == [] and raised == []  # recorded, not made: its status is not checked yet
    status[0] = 0
    graph.replay()
    torch.testing.assert_close(graph.outputs, hwplug.ops.rms_norm.reference(x, weight, EPS))
    status[0] = 1
    with pytest.raises(UnsupportedError, match="status 1"):
        graph.replay()
    assert made == [0, 1] and raised == [1]


# ---- the engine: decode graphs on the real SmolLM2 GGUF ----

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,",
           "Once upon a time, in a small village at the edge of a dark and ancient forest"]


def _generate(llm: hwplug.LLM) -> list:
    params = hwplug.SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True)
    return llm.generate(PROMPTS, params) + llm.generate(PROMPTS[:1], params)


@pytest.mark.slow
def test_decode_graphs_give_the_eager_tokens_and_logprobs(caplog):
    graphed = hwplug.LLM(max_num_seqs=8)
    try:
        with caplog.at_level(logging.INFO, "hwplug.model_zoo.engine.decode_graphs"):
            got = _generate(graphed)
        graphs = graphed.runner.graphs
        # 23 decode steps per bucket, the first of each eager (before it is recorded)
        assert graphs.recorded == [1, 4] and graphs.replays == 2 * 22
        assert graphs.describe() == ("step graphs: decode batches of up to 1, 4 sequences "
                                     "replayed (44 steps)")
        assert ("decode steps of up to 4 sequences replay a recorded step (native kernel calls)"
                in caplog.text)
    finally:
        graphed.close()
    eager = hwplug.LLM(max_num_seqs=8, step_graphs=False)
    try:
        assert eager.runner.graphs is None
        want = _generate(eager)
    finally:
        eager.close()
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for g_row, w_row in zip(g.logprobs, w.logprobs, strict=True):
            assert g_row.keys() == w_row.keys()
            for token in g_row:
                assert g_row[token].logprob == pytest.approx(w_row[token].logprob, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("disabled", ["", "gemm_avx2"], ids=["c-linear", "onednn-from-two"])
def test_float_weights_replay_where_every_op_is_c_and_say_why_not_elsewhere(
        monkeypatch, fresh_discovery, disabled):
    """On AVX2 CPUs a float model's decode step is C kernels (the embedding, gemv_avx2 for
    one row, gemm_avx2 for more); with gemm_avx2 disabled (or without AVX2) a step of two
    sequences calls oneDNN's GEMM, a torch call, and runs eagerly, saying so."""
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", disabled)
    params = hwplug.SamplingParams(max_tokens=4)
    llm = hwplug.LLM(dequantize=True, max_num_seqs=2)
    try:
        pair = llm.generate(PROMPTS[:2], params)
        single = llm.generate(PROMPTS[:1], params)
        graphs = llm.runner.graphs
        avx2 = {"avx2", "fma", "f16c"} <= hwplug.current_platform().facts.features
        replayed = {1, 2} if avx2 and not disabled else {1} if avx2 else set()
        assert set(graphs.recorded) == replayed
        assert set(graphs.refused) == {1, 2} - replayed
        # three decode steps each, the pair's then the single sequence's; the first of
        # each bucket runs eagerly (before it is recorded)
        assert graphs.replays == 2 * len(replayed)
        if replayed == {1, 2}:
            assert "batches of up to 1, 2 sequences replayed (4 steps)" in graphs.describe()
        else:
            assert "batches of up to 2 sequences run eagerly (the step computes in torch " \
                   "(_linear_pointwise)" in graphs.describe()
        assert single[0].outputs[0].token_ids == pair[0].outputs[0].token_ids
    finally:
        llm.close()


def test_a_platform_that_replays_no_steps_never_records():
    """Graph replay is a platform capability: without a step recorder the runner makes no
    decode graphs, whatever the kernels (the CPU platform's recorder is the native calls)."""
    class EagerCpu(CpuPlatform):
        def step_recorder(self) -> None:
            return None

    config, state = random_state("llama")
    eager, platform = EagerCpu(), hwplug.current_platform()
    assert platform.step_recorder().name == "native kernel calls"
    assert platform.describe()["step_replay"] == "native kernel calls"
    for where, graphs in ((eager, False), (platform, True)):
        model, ctx = build_model(InMemoryCheckpoint(config, state), platform=where,
                                 dtype="float32", block_size=8)
        runner = ModelRunner(model, ctx, 16, step_graphs=GraphLimits(4, 64))
        assert (runner.graphs is not None) == graphs
    assert EagerCpu().describe()["step_replay"] is None


def _first_step_logits(runner: ModelRunner, tokens: list[int], positions: list[int],
                       slots: list[int], tables: list[list[int]]) -> torch.Tensor:
    """The logits of an eager decode step whose sequences each hold one token."""
    metadata = AttentionMetadata(torch.tensor(slots), torch.tensor(tables, dtype=torch.int32),
                                 torch.ones(len(tokens), dtype=torch.int32),
                                 torch.arange(len(tokens) + 1, dtype=torch.int32), 1, 1)
    with torch.inference_mode():
        return runner.model.compute_logits(runner.forward(StepInputs(
            torch.tensor(tokens), torch.tensor(positions), metadata, None)))


def test_a_bucket_is_recorded_at_its_second_decode_step_and_replays_the_eager_logits():
    """A bucket's first decode step runs eagerly (a one-token generation records nothing);
    its second is recorded and replayed, with the logits the eager step computes."""
    config, state = random_state("llama")
    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8)
    runner = ModelRunner(model, ctx, 16, step_graphs=GraphLimits(4, 64))
    graphs = runner.graphs
    tokens, positions, slots, tables = [5, 7], [0, 0], [0, 8], [[0], [1]]
    assert graphs.logits(tokens, positions, slots, tables) is None
    assert (graphs.recorded, graphs.refused, graphs.replays) == ([], {}, 0)
    assert graphs.describe() == "step graphs: none recorded yet (no decode step)"
    got = graphs.logits(tokens, positions, slots, tables)
    if graphs.refused:  # a CPU without the C kernels of every op: the bucket runs eagerly
        assert got is None and list(graphs.refused) == [2]
        return
    assert (graphs.recorded, graphs.replays) == ([2], 1)
    torch.testing.assert_close(got, _first_step_logits(runner, tokens, positions, slots,
                                                       tables))
    assert graphs.logits(tokens, positions, slots, tables) is not None  # replayed again
    assert (graphs.recorded, graphs.replays) == ([2], 2)


def test_step_graphs_takes_a_bool():
    with pytest.raises(ConfigError, match="step_graphs must be True or False, got str 'no'"):
        hwplug.LLM(step_graphs="no")


def test_verify_buckets_hold_every_proposal_count_without_padding():
    # one sequence, k = 4: a verify step of j proposals replays in a bucket of j + 1 rows
    one = DecodeGraphs(None, None, max_num_seqs=1, max_model_len=64, block_size=16,
                       rows_per_seq=5)
    assert one.buckets == [1, 2, 3, 4, 5]
    # batches of 1, 2 and 4 sequences with j proposals each, j = 1 .. 4
    four = DecodeGraphs(None, None, max_num_seqs=4, max_model_len=64, block_size=16,
                        rows_per_seq=5)
    assert four.buckets == [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20]
    # a warm-up records the batch buckets and their steps of k proposals only
    assert (one.warm_buckets, four.warm_buckets) == ([1, 5], [1, 2, 4, 5, 10, 20])


def test_a_recorder_that_warms_up_gets_each_recording_run_eagerly_first():
    """``StepRecorder.warms_up`` (CUDA graphs: a capture must not compile kernels): the
    engine runs the step once over the recording's inputs right before each recording, and
    the bucket still replays the eager step's logits."""
    config, state = random_state("llama")
    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8)
    runner = ModelRunner(model, ctx, 16, step_graphs=GraphLimits(4, 64))
    recorder = type(runner.graphs.recorder)()
    recorder.warms_up = True
    bodies = []

    def step(*args):
        bodies.append(args[2].max_seq_len)
        return runner._logits(*args)

    graphs = DecodeGraphs(step, recorder, 4, 64, 8)
    tokens, positions, slots, tables = [5, 7], [0, 0], [0, 8], [[0], [1]]
    with torch.inference_mode():
        assert graphs.logits(tokens, positions, slots, tables) is None  # eager: bucket's 1st
        got = graphs.logits(tokens, positions, slots, tables)
    if graphs.refused:  # a CPU without the C kernels of every op: the bucket runs eagerly
        pytest.skip(f"no native kernels for every op: {graphs.refused}")
    # the shortest context's warm-up and recording, then the longest's
    assert bodies == [1, 1, 64, 64]
    assert graphs.recorded == [2]
    torch.testing.assert_close(got, _first_step_logits(runner, tokens, positions, slots,
                                                       tables))
