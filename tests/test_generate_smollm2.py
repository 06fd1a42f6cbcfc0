"""``hwplug.LLM`` on the real SmolLM2-135M-Instruct checkpoint.

Greedy generation is checked against transformers' ``LlamaForCausalLM`` holding the same
weights, then against itself under the engine's batching paths: prompts of different
lengths in one batch, a prompt prefilled in chunks alongside decodes, and sequences
preempted and recomputed when the KV cache runs out. Then stop strings, max tokens,
seeded sampling and the errors a user can hit.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

import hwplug
from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.engine import Output
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

pytestmark = pytest.mark.slow  # loads the real model and runs transformers beside it

NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a dark and ancient forest, there",
    "1, 2, 3, 4,",
    "The three primary colors are",
]
GREEDY = hwplug.SamplingParams(max_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def llm() -> hwplug.LLM:
    return hwplug.LLM(dequantize=True)  # the float weights transformers runs


@pytest.fixture(scope="module")
def expected(llm: hwplug.LLM) -> list[list[int]]:
    """transformers' greedy tokens for each prompt alone, from the same weights, up to and
    including the first end-of-sequence token."""
    checkpoint = load_checkpoint(resolve_model(None), dequantize=True)
    reference = LlamaForCausalLM(checkpoint.transformers_config()).eval()
    result = reference.load_state_dict(dict(checkpoint.weights()), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    reference.tie_weights()
    tokens = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([llm.tokenize(prompt)])
            out = reference.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NEW_TOKENS,
                                     eos_token_id=list(checkpoint.eos_token_ids))
            tokens.append(out[0, ids.shape[1]:].tolist())
    return tokens


@pytest.fixture(scope="module")
def batched(llm: hwplug.LLM) -> list[Output]:
    return llm.generate(PROMPTS, GREEDY)


def test_greedy_tokens_match_transformers(batched, expected):
    assert [output.token_ids for output in batched] == expected


def test_a_mixed_length_batch_matches_each_prompt_alone(llm, batched):
    alone = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS[:3]]
    assert [o.token_ids for o in alone] == [o.token_ids for o in batched[:3]]
    assert [o.text for o in alone] == [o.text for o in batched[:3]]
    assert [o.num_prompt_tokens for o in batched] == [len(llm.tokenize(p)) for p in PROMPTS]


def test_chunked_prefill_and_preemption_give_the_same_tokens(batched):
    # 8-token steps split every prompt; 6 blocks of 16 tokens hold two of these sequences,
    # so the newest are preempted and recomputed
    small = hwplug.LLM(max_num_batched_tokens=8, num_kv_blocks=6, dequantize=True)
    outputs = small.generate(PROMPTS, GREEDY)
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in batched]


def test_stop_string_is_trimmed(llm, batched):
    full = batched[0].text
    stop = full.strip().split()[2]  # a word from the middle of the greedy text
    output = llm.generate(PROMPTS[0], hwplug.SamplingParams(max_tokens=NEW_TOKENS,
                                                            stop=[stop]))[0]
    assert output.finish_reason == "stop"
    assert output.text == full[:full.index(stop)]


def test_max_tokens_and_stream(llm, batched):
    output = llm.generate(PROMPTS[1], hwplug.SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert output.finish_reason == "length" and len(output.token_ids) == 5
    assert output.token_ids == batched[1].token_ids[:5]
    stream = llm.stream(PROMPTS[1], GREEDY)
    assert "".join(stream) == batched[1].text == stream.output.text


def test_seeded_sampling_is_reproducible(llm):
    sampled = hwplug.SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50,
                                    seed=7, ignore_eos=True)
    first = llm.generate(PROMPTS[0], sampled)[0].token_ids
    in_batch = llm.generate(PROMPTS[:2], [sampled, GREEDY])[0].token_ids
    other_seed = llm.generate(PROMPTS[0], hwplug.SamplingParams(
        max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=8, ignore_eos=True))[0]
    assert first == in_batch
    assert other_seed.token_ids != first


def test_chat_uses_the_template(llm):
    ids = llm.apply_chat_template("What is 2 + 2?")
    assert llm.tokenizer.decode(ids).count("What is 2 + 2?") == 1
    reply = llm.chat("What is 2 + 2?", hwplug.SamplingParams(max_tokens=8))
    assert reply.text and reply.num_prompt_tokens == len(ids)


def test_a_prompt_longer_than_the_context_names_both_lengths(llm):
    too_long = [1] * (llm.max_model_len + 10)
    with pytest.raises(ModelError, match=f"{len(too_long)} tokens.*{llm.max_model_len}"):
        llm.generate([too_long])
    assert not llm.engine.has_unfinished()


def test_bad_sampling_values_and_wrong_model_kind(llm):
    with pytest.raises(ConfigError, match=r"top_p must be a number in \(0, 1\]"):
        llm.generate(PROMPTS[0], hwplug.SamplingParams(top_p=1.5))
    with pytest.raises(ModelError, match="needs an encoder"):
        llm.embed("text")
