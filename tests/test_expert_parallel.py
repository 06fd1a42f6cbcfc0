"""Expert parallelism in real gloo process groups: each rank holds a contiguous share of
every mixture-of-experts layer's experts (uneven where the ranks do not divide them), and
tokens travel to their experts' ranks and back through the communicator's all-to-all.

Qwen3-MoE (8 experts, top-3, a dense layer between sparse ones), Mixtral (5 experts) and
DeepSeek-V3 (latent attention split by heads, grouped routing, a shared expert)
saved by transformers, and a Qwen3-MoE GGUF with its experts kept in K-quant blocks: the
ranks' prefill logits equal one process's within ATOL (the ranks sum each token's experts
in another order), and greedy decoding of two prompts together gives one process's tokens,
with steps where some ranks route no token (one decoded token per prompt, three ranks).
Through ``LLM`` (spawned ranks) the text equals one process's; without
``enable_expert_parallel`` tensor parallelism of such a model is refused, saying how.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_workers import moe_greedy, run
from test_moe_models import CONFIGS
from tiny_checkpoints import _tokenizer
from tiny_models import randomize

from hwplug import LLM, SamplingParams
from hwplug.errors import UnsupportedError

pytestmark = pytest.mark.slow  # each test starts worker processes

#: Max |ranks - one process| of the prefill logits (fp32; measured below 1e-5).
ATOL = 1e-4
PROMPTS = [[5, 17, 3, 90, 41, 8, 77], [61, 7, 7]]
STEPS = 6


#: What three ranks split evenly (the dense layers' heads, intermediate size, vocabulary).
THREE_WAY = dict(num_attention_heads=6, num_key_value_heads=3, vocab_size=129)


def _saved(name: str, path: Path, **overrides: int) -> Path:
    from transformers import AutoModelForCausalLM

    config = CONFIGS[name]()
    config.eos_token_id, config.bos_token_id = 1, 0
    for key, value in overrides.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config).eval()
    randomize(model, std=0.15)
    model.save_pretrained(path)
    _tokenizer(config.vocab_size).save_pretrained(path)
    return path


@pytest.mark.parametrize("name, ranks", [("qwen3-moe", 3), ("mixtral", 2), ("deepseek-v3", 2)])
def test_ranks_holding_shares_of_the_experts_give_one_process_logits_and_tokens(
        name, ranks, tmp_path):
    path = str(_saved(name, tmp_path, **(THREE_WAY if ranks == 3 else {})))
    (want,) = run(moe_greedy, 1, path, PROMPTS, STEPS)
    got = run(moe_greedy, ranks, path, PROMPTS, STEPS)
    experts = len(want["held"][0])
    for rank, result in enumerate(got):
        assert (result["prefill"] - want["prefill"]).abs().max() < ATOL, f"rank {rank}"
        assert result["tokens"] == want["tokens"], f"rank {rank}"
    # contiguous shares covering every expert once, in every sparse layer
    for layer in range(len(want["held"])):
        held = [r["held"][layer] for r in got]
        assert sum(held, []) == list(range(experts))
        assert max(map(len, held)) - min(map(len, held)) <= 1


def test_gguf_experts_kept_in_blocks_split_over_ranks(tmp_path):
    pytest.importorskip("llama_cpp")
    from test_moe_gguf import MODELS, SIZES
    from tiny_moe_gguf import VOCAB, quantize_gguf, write_moe_gguf
    from transformers import AutoModelForCausalLM

    config_class, settings, (_, k_quant_sizes) = MODELS["qwen3-moe"]
    config = config_class(**{**SIZES, "vocab_size": VOCAB + 1}, **settings, **k_quant_sizes)
    model = AutoModelForCausalLM.from_config(config).eval()
    randomize(model, std=0.05)
    f32 = write_moe_gguf(model, tmp_path / "f32.gguf")  # an even vocabulary: two shares
    path = str(quantize_gguf(f32, tmp_path / "q4_k_m.gguf", "Q4_K_M"))
    (want,) = run(moe_greedy, 1, path, PROMPTS, STEPS)
    got = run(moe_greedy, 2, path, PROMPTS, STEPS)
    scale = float(want["prefill"].max() - want["prefill"].min())
    for rank, result in enumerate(got):
        assert float((result["prefill"] - want["prefill"]).abs().max()) / scale < 1e-3
        assert result["tokens"] == want["tokens"], f"rank {rank}"


def test_llm_with_expert_parallelism_generates_one_process_text(tmp_path):
    path = str(_saved("qwen3-moe", tmp_path))
    params = SamplingParams(max_tokens=STEPS, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(path).generate(PROMPTS, params)]
    llm = LLM(path, tensor_parallel_size=2, enable_expert_parallel=True)
    try:
        assert llm.parallelism.describe() == "tensor-parallel 2, expert-parallel 2"
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == want
    finally:
        llm.close()


def test_tensor_parallelism_of_experts_without_expert_parallelism_is_refused(tmp_path):
    path = str(_saved("mixtral", tmp_path))
    with pytest.raises(UnsupportedError, match="enable_expert_parallel=True"):
        LLM(path, tensor_parallel_size=2)
