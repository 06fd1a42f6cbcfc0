"""``hwplug.LLM``'s API on the tiny random Llama: validated inputs, logprobs, ``n`` samples.

Log-probabilities are compared with transformers' ``LlamaForCausalLM`` loaded from the same
directory (fp32 on both sides, same weights): prompt log-probabilities with
``log_softmax`` of its logits over the prompt, sample log-probabilities with the scores
of its greedy ``generate``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import write_tiny_llama as write_tiny_checkpoint
from tiny_llama import SEP, VOCAB_SIZE, tiny_model_dir  # noqa: F401 (fixture)
from transformers import LlamaForCausalLM

import hwplug
from hwplug.errors import ConfigError, ModelError, UnknownNameError
from hwplug.model_zoo.llm_config import DEFAULT_MAX_MODEL_LEN

#: Max abs difference of a log-probability from transformers' (fp32, values O(10)).
LOGPROB_ATOL = 1e-4
PROMPT = [2023, 2003, 1037, 3231, 1997, 1996, 3793, 2003, 2307, 1012, 2009]
GREEDY = hwplug.SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> hwplug.LLM:
    return hwplug.LLM(model_dir, num_kv_blocks=64, dtype="float32")  # fp32, as transformers


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


# --- validation ---------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(max_tokens=2.0), "max_tokens must be an integer >= 1, got 2.0"),
    (dict(max_tokens=True), "max_tokens must be an integer >= 1, got True"),
    (dict(max_tokens="8"), "max_tokens must be an integer >= 1, got '8'"),
    (dict(seed=-1), r"seed must be None or an integer in \[0, 2\*\*64 - n\]"),
    (dict(seed=2**64), r"seed must be None or an integer in \[0, 2\*\*64 - n\]"),
    (dict(seed=2**64 - 1, n=2), r"seed must be None or an integer in \[0, 2\*\*64 - n\]"),
    (dict(seed=1.5), r"seed must be None or an integer"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature="hot"), "temperature must be a finite number >= 0"),
    (dict(top_k=2.5), "top_k must be an integer >= 0"),
    (dict(top_p=float("inf")), r"top_p must be a number in \(0, 1\]"),
    (dict(n=0), "n must be an integer >= 1"),
    (dict(logprobs=-1), "logprobs must be None or an integer >= 0"),
    (dict(prompt_logprobs=1.0), "prompt_logprobs must be None or an integer >= 0"),
    (dict(stop=[""]), "stop must be a string or a list of non-empty strings"),
    (dict(stop=5), "stop must be a string or a list of non-empty strings"),
    (dict(stop_token_ids=[-3]), "stop_token_ids must be a list of integers >= 0"),
    (dict(ignore_eos="yes"), "ignore_eos must be True or False"),
])
def test_sampling_params_check_types_and_ranges(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        hwplug.SamplingParams(**kwargs)


def test_largest_seed_is_accepted(llm):
    params = hwplug.SamplingParams(max_tokens=2, temperature=1.0, seed=2**64 - 2, n=2)
    assert len(llm.generate([PROMPT], params)[0].outputs) == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(block_size=0), "block_size must be None .* or an integer >= 1, got 0"),
    (dict(block_size="16"), "block_size must be None .* or an integer >= 1, got '16'"),
    (dict(block_size=7), "block_size 7 is not accepted by the attention backends that can "
                         "serve this model: TORCH_PAGED accepts 1, 8, 16"),
    (dict(seed=-1), r"seed must be None \(random\) or an integer in \[0, 2\*\*64 - 1\]"),
    (dict(seed=2**64), r"seed must be None \(random\) or an integer in \[0, 2\*\*64 - 1\]"),
    (dict(num_kv_blocks=True), "num_kv_blocks must be None, a block count or a fraction"),
    (dict(num_kv_blocks="all"), "num_kv_blocks must be None, a block count or a fraction"),
    (dict(num_kv_blocks=1.5), r"fraction of free memory must be in \(0, 1\)"),
    (dict(max_num_seqs=2.0), "max_num_seqs must be an integer >= 1"),
    (dict(step_graphs="no"), "step_graphs must be True or False, got str 'no'"),
    (dict(kv_cache_dtype=""), "kv_cache_dtype must be one of .* or None"),
    (dict(kv_load_failure_policy=""), "kv_load_failure_policy must be one of fail, recompute"),
    (dict(calculate_kv_scales="no"), "calculate_kv_scales must be True or False"),
    (dict(kv_connector=3), "kv_connector must name a registered connector or be a Connector "
                           "subclass, got int 3"),
    (dict(kv_connector="shared_storage", kv_connector_config=["a"]),
     "kv_connector_config must be a mapping of option names to values, got list"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1, got 0"),
    (dict(max_num_sequences=4), "unknown LLM option max_num_sequences; options: model, dtype"),
])
def test_llm_options_are_checked(model_dir, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        hwplug.LLM(model_dir, **kwargs)


def test_an_option_not_given_takes_its_variable(model_dir, monkeypatch):
    monkeypatch.setenv("HWPLUG_ATTENTION_BACKEND", "NOPE")
    with pytest.raises(UnknownNameError, match="unknown attention backend 'NOPE'"):
        hwplug.LLM(model_dir, num_kv_blocks=8)
    monkeypatch.setenv("HWPLUG_ATTENTION_BACKEND", " ")
    assert hwplug.LLM(model_dir, num_kv_blocks=8).config.attention_backend == "TORCH_PAGED"


def test_the_resolved_configuration_says_what_was_settled(llm):
    config = llm.config
    assert (config.platform, config.attention_backend, config.num_kv_blocks) == (
        "cpu", "TORCH_PAGED", 64)
    assert config.options.num_kv_blocks == 64 and config.dtype == "float32"
    assert config.describe()["options"] == {"model": config.options.model, "num_kv_blocks": 64,
                                            "dtype": "float32"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.block_size = 8


def test_the_kv_cache_holds_max_num_seqs_sequences_of_max_model_len(model_dir):
    llm = hwplug.LLM(model_dir, max_num_seqs=3, max_model_len=100, dtype="float32")
    config, plan = llm.config, llm.kv_cache_plan
    assert config.max_model_len == llm.engine.max_model_len == 100
    assert config.num_kv_blocks == plan.num_blocks == 3 * -(-100 // config.block_size)
    assert "max_num_seqs=3 sequences of max_model_len=100 tokens" in config.kv_cache
    assert "max_model_len 100: as given" in config.kv_cache
    allocated = sum(cache.numel() * cache.element_size() for cache in llm.runner.kv_caches)
    assert allocated == plan.nbytes
    with pytest.raises(ModelError, match=r"a sequence holds 100 \(max_model_len\)"):
        llm.generate(list(range(5, 105)), GREEDY)


def test_max_model_len_defaults_to_the_context_capped(model_dir, tmp_path):
    llm = hwplug.LLM(model_dir, dtype="float32")  # a context of 512 tokens
    assert llm.max_model_len == 512 and "512: the model's context length" in llm.config.kv_cache
    assert llm.config.num_kv_blocks == 64 * 512 // llm.config.block_size  # max_num_seqs 64
    long = write_tiny_checkpoint(tmp_path / "long", max_position_embeddings=1 << 20)
    llm = hwplug.LLM(long, dtype="float32")
    assert llm.max_model_len == DEFAULT_MAX_MODEL_LEN
    assert f"the model's context length {1 << 20}, capped at {DEFAULT_MAX_MODEL_LEN}" in (
        llm.config.kv_cache)
    # positions stay below max_model_len: the RoPE table has that many rows, not 2**20
    tables = [m.cos_sin_cache for m in llm.model.modules() if hasattr(m, "cos_sin_cache")]
    assert tables and all(t.shape[0] == DEFAULT_MAX_MODEL_LEN for t in tables)


def test_a_max_model_len_beyond_the_context_is_a_config_error(model_dir):
    with pytest.raises(ConfigError, match=r"max_model_len must be an integer in \[1, 512\] "
                                          r"\(the model's context length"):
        hwplug.LLM(model_dir, max_model_len=513)


@pytest.mark.parametrize(("prompt", "message"), [
    ([5, -1], r"token ids must be integers in \[0, 30522\)"),
    ([5, VOCAB_SIZE], r"token ids must be integers in \[0, 30522\).*30522"),
    ([5, 1.5], "a prompt must be a string or a list of integer token ids, got list"),
    ([5, True], "a prompt must be a string or a list of integer token ids"),
    ([[5, 6], None], "a prompt must be a string or a list of integer token ids, got NoneType"),
    ([[]], "the prompt is empty"),
])
def test_bad_prompts_are_refused_before_anything_runs(llm, prompt, message):
    steps = llm.engine.num_steps
    with pytest.raises(ModelError, match=message):
        llm.generate(prompt, GREEDY)
    assert llm.engine.num_steps == steps and not llm.engine.has_unfinished()


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(logprobs=VOCAB_SIZE + 1), "logprobs=30523 exceeds the vocabulary of 30522"),
    (dict(prompt_logprobs=VOCAB_SIZE + 1), "prompt_logprobs=30523 exceeds the vocabulary"),
    (dict(stop_token_ids=[VOCAB_SIZE]), "stop_token_ids must be below the vocabulary size"),
])
def test_sampling_values_beyond_the_vocabulary(llm, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        llm.generate([PROMPT], hwplug.SamplingParams(**kwargs))


def test_wrong_sampling_list_and_streams_of_several_samples(llm):
    with pytest.raises(ConfigError, match="got 1 sampling values for 2 prompts"):
        llm.generate([PROMPT, PROMPT], [GREEDY])
    with pytest.raises(ConfigError, match="stream\\(\\) yields one completion, got n=2"):
        llm.stream(PROMPT, hwplug.SamplingParams(n=2))


# --- log-probabilities --------------------------------------------------------------------

def test_prompt_logprobs_match_transformers(llm, reference):
    output = llm.generate([PROMPT], hwplug.SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0].log_softmax(-1)
    entries = output.prompt_logprobs
    assert len(entries) == len(PROMPT) and entries[0] is None
    for position, entry in enumerate(entries[1:]):
        row = expected[position]
        token = PROMPT[position + 1]
        assert next(iter(entry)) == token  # the prompt token first, then the top 3
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=LOGPROB_ATOL)
        # a deep rank is exact only up to the logprobs' own tolerance: tokens within
        # LOGPROB_ATOL of the prompt token may fall either side of it
        assert (int((row > row[token] + LOGPROB_ATOL).sum()) + 1 <= entry[token].rank
                <= int((row > row[token] - LOGPROB_ATOL).sum()) + 1)
        top = row.topk(3)
        for rank, (value, index) in enumerate(zip(top.values, top.indices, strict=True), 1):
            assert entry[int(index)].rank == rank
            assert entry[int(index)].logprob == pytest.approx(value.item(), abs=LOGPROB_ATOL)
        assert len(entry) in (3, 4)  # 3 when the prompt token is itself in the top 3
        assert entry[token].decoded_token == llm.tokenizer.decode([token])


def test_prompt_logprobs_are_the_same_when_the_prompt_is_prefilled_in_chunks(model_dir, llm):
    params = hwplug.SamplingParams(max_tokens=2, prompt_logprobs=2)
    whole = llm.generate([PROMPT], params)[0]
    chunked_llm = hwplug.LLM(model_dir, num_kv_blocks=64, max_num_batched_tokens=4,
                             dtype="float32")
    chunked = chunked_llm.generate([PROMPT], params)[0]
    # the same tokens, logprobs within 1e-4 (rounding to 4 decimals would split values
    # that straddle a rounding boundary; a deep rank moves with near-ties)
    assert len(chunked.prompt_logprobs) == len(whole.prompt_logprobs)
    for got, want in zip(chunked.prompt_logprobs, whole.prompt_logprobs, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            assert list(got) == list(want)
            assert [p.logprob for p in got.values()] == pytest.approx(
                [p.logprob for p in want.values()], abs=1e-4)


def test_sample_logprobs_match_transformers_greedy_scores(llm, reference):
    output = llm.generate([PROMPT], hwplug.SamplingParams(max_tokens=5, ignore_eos=True,
                                                          logprobs=2))[0]
    with torch.inference_mode():
        ids = torch.tensor([PROMPT])
        theirs = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=5, min_new_tokens=5, output_logits=True,
                                    return_dict_in_generate=True, pad_token_id=SEP)
    assert output.token_ids == theirs.sequences[0, len(PROMPT):].tolist()
    assert len(output.logprobs) == 5
    for token, entry, logits in zip(output.token_ids, output.logprobs, theirs.logits,
                                    strict=True):
        row = logits[0].float().log_softmax(-1)
        assert entry[token].rank == 1  # greedy: the sampled token is the most likely
        assert entry[token].logprob == pytest.approx(row[token].item(), abs=LOGPROB_ATOL)
        second = int(row.topk(2).indices[1])
        assert entry[second].rank == 2
    assert output.cumulative_logprob == pytest.approx(
        sum(entry[token].logprob for token, entry in zip(output.token_ids, output.logprobs,
                                                         strict=True)))


def test_no_logprobs_unless_asked(llm):
    output = llm.generate([PROMPT], GREEDY)[0]
    assert output.logprobs is None and output.prompt_logprobs is None
    assert output.cumulative_logprob is None


# --- n samples, stop reasons -------------------------------------------------------------

def test_n_seeded_samples_are_the_seeds_of_single_requests(llm):
    params = hwplug.SamplingParams(max_tokens=6, ignore_eos=True, temperature=1.5, seed=40,
                                   n=3, logprobs=0)
    output = llm.generate([PROMPT], params)[0]
    assert [c.index for c in output.outputs] == [0, 1, 2]
    singles = [llm.generate([PROMPT], hwplug.SamplingParams(
        max_tokens=6, ignore_eos=True, temperature=1.5, seed=40 + i))[0].token_ids
        for i in range(3)]
    assert [c.token_ids for c in output.outputs] == singles
    assert len({tuple(ids) for ids in singles}) == 3  # different seeds, different samples
    assert all(len(c.logprobs) == 6 and all(len(e) == 1 for e in c.logprobs)
               for c in output.outputs)
    assert output.text == output.outputs[0].text


def test_stop_reason_names_the_stop_token_or_string(llm):
    free = llm.generate([PROMPT], GREEDY)[0]
    token = free.token_ids[2]
    by_token = llm.generate([PROMPT], hwplug.SamplingParams(max_tokens=6,
                                                            stop_token_ids=[token]))[0]
    assert by_token.finish_reason == "stop" and by_token.outputs[0].stop_reason == token
    word = free.text.split()[1]
    by_text = llm.generate([PROMPT], hwplug.SamplingParams(max_tokens=6, stop=[word]))[0]
    assert by_text.outputs[0].stop_reason == word
    assert free.outputs[0].stop_reason is None and free.finish_reason == "length"


def test_many_prompts_against_a_cache_for_four_finish_with_their_solo_tokens(model_dir: Path):
    # 104 prompts, KV blocks for 4 at a time: preemptions, recomputes, prefix-cache hits
    # and decode batches of every size (step graphs replaying smaller steps after larger
    # ones: a larger step's rows once stayed in the graph and wrote their KV again, into
    # blocks freed and reused meanwhile), and every prompt gets its solo tokens
    from tiny_llama import random_prompts

    prompts = random_prompts(11, 104)
    params = hwplug.SamplingParams(max_tokens=8, ignore_eos=True)
    tight = hwplug.LLM(model_dir, num_kv_blocks=12, block_size=16, max_num_seqs=16,
                       dtype="float32")  # 37 tokens at most: 3 blocks each, 4 sequences
    together = [out.token_ids for out in tight.generate(prompts, params)]
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.runner.graphs.replays > 0
    tight.close()
    roomy = hwplug.LLM(model_dir, num_kv_blocks=64, block_size=16, dtype="float32")
    solo = [roomy.generate([prompt], params)[0].token_ids for prompt in prompts]
    roomy.close()
    assert together == solo


def _rss_anon() -> int:
    """This process's anonymous resident memory in bytes (``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_the_kv_cache_takes_memory_only_as_it_is_written(model_dir):
    """A CPU KV cache is zeros that take memory page by page as the steps write them:
    allocating one writes nothing (the load's time and memory do not grow with it)."""
    before = _rss_anon()
    llm = hwplug.LLM(model_dir, max_num_seqs=1, num_kv_blocks=32768, dtype="float32")
    allocated = sum(cache.numel() * cache.element_size() for cache in llm.runner.kv_caches)
    grown = _rss_anon() - before
    assert allocated >= 256 * 2**20 and grown < allocated / 8, (grown, allocated)
    assert all(not cache.any() for cache in llm.runner.kv_caches)
    written = _rss_anon()
    solo = llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    assert _rss_anon() - written < allocated / 8
    small = hwplug.LLM(model_dir, max_num_seqs=1, num_kv_blocks=16, dtype="float32")
    assert small.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == solo


def test_warm_up_records_every_bucket_so_the_first_decode_steps_replay(model_dir):
    """``LLM.warm_up`` records each decode batch bucket's step graph ahead: from the first
    decode step on every step replays (none runs eagerly, as one would before its bucket
    is recorded), and the tokens are the eager engine's."""
    prompts = [PROMPT, PROMPT[:5], PROMPT[3:]]
    llm = hwplug.LLM(model_dir, num_kv_blocks=64, dtype="float32", max_num_seqs=4)
    try:
        assert llm.warm_up() == [1, 2, 4]
        stats = llm.engine.stats()
        assert (stats.step_graph_buckets, stats.replayed_steps, stats.eager_decode_steps) == (
            3, 0, 0)
        got = [output.outputs[0].token_ids for output in llm.generate(prompts, GREEDY)]
        stats = llm.engine.stats()
        # one prefill step gives each its first token, then 5 decode steps of the three
        assert (stats.replayed_steps, stats.eager_decode_steps) == (5, 0)
        assert llm.warm_up() == [1, 2, 4] and llm.engine.stats().step_graph_buckets == 3
    finally:
        llm.close()
    eager = hwplug.LLM(model_dir, num_kv_blocks=64, dtype="float32", step_graphs=False)
    try:
        assert eager.warm_up() == []
        assert [output.outputs[0].token_ids for output in eager.generate(prompts, GREEDY)] \
            == got
        assert eager.engine.stats().step_graph_buckets == 0
    finally:
        eager.close()
