"""hwplug's decoders against transformers' implementations holding the same weights.

Tiny random configs cover Llama (plain and llama3 RoPE scaling, tied embeddings), Mistral
and Qwen2 with an active sliding window, Qwen2's QKV bias, Qwen3's q/k norms and explicit
head_dim. Each compares prefill logits of a batch of sequences of different lengths, then
decode steps through the paged cache against transformers' full-sequence logits.
The slow test decodes greedily with the real SmolLM2-135M checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from tiny_models import randomize
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from hwplug import registries
from hwplug.attention import PagedAttentionParams
from hwplug.discovery import current_platform
from hwplug.errors import ModelError
from hwplug.kernel_registry import ops
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.registry import current_source

#: Max abs logit difference allowed in fp32 (logits are O(1) with these weights).
FP32_ATOL = 1e-4
#: bf16 against transformers in fp32: max abs logit difference relative to the logits'
#: range (bf16 keeps 8 bits of mantissa through every layer).
BF16_RTOL = 5e-2
#: The real SmolLM2 checkpoint in fp32 (30 layers, logits up to ~30).
SMOLLM2_ATOL = 5e-4

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**TINY, architectures=["LlamaForCausalLM"]),
    # wavelengths of the 8 frequencies span all three llama3 regimes (< 8, 8..32, > 32)
    "llama3-rope-tied": lambda: LlamaConfig(
        **TINY, architectures=["LlamaForCausalLM"], tie_word_embeddings=True,
        rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    "mistral-window": lambda: MistralConfig(**TINY, architectures=["MistralForCausalLM"],
                                            sliding_window=8),
    # layer 0 full attention, layers 1-2 windowed, as transformers derives from these
    "qwen2-window-bias": lambda: Qwen2Config(**TINY, architectures=["Qwen2ForCausalLM"],
                                             use_sliding_window=True, sliding_window=8,
                                             max_window_layers=1),
    "qwen3": lambda: Qwen3Config(**TINY, architectures=["Qwen3ForCausalLM"], head_dim=32),
}
#: Full sequence lengths and how many of their tokens form the prompt (the rest decode).
SEQ_LENS, PROMPT_LENS = (20, 17, 12), (14, 11, 6)
DECODE_STEPS = 6


def reference_and_ours(config: PretrainedConfig, dtype: str = "float32",
                       attention_backend: str | None = None):
    reference = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(reference)
    model, ctx = build_model(InMemoryCheckpoint(config, reference.state_dict()), dtype=dtype,
                             block_size=8, attention_backend=attention_backend)
    return reference, model, ctx


def reference_logits(reference: torch.nn.Module, sequences: list[torch.Tensor]
                     ) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [reference(seq[None]).logits[0].float() for seq in sequences]


def random_sequences(vocab_size: int, lengths: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab_size, (n,), generator=generator) for n in lengths]


class WriteFirstBackend(TorchPagedBackend):
    """TORCH_PAGED attention that leaves the KV-cache write to the caller."""

    updates_kv_cache_in_forward = False

    @classmethod
    def get_name(cls) -> str:
        return "TEST_WRITE_FIRST"

    def forward(self, query, key, value, kv_cache, metadata, scale):
        return ops.paged_attention(query, kv_cache, metadata, PagedAttentionParams(
            scale, self.spec.causal, self.spec.sliding_window))


@pytest.fixture
def write_first_backend():
    current_platform()  # discovery first, so it does not run over the registration
    token = current_source.set(__name__)
    try:
        registries.attention_backends.register(WriteFirstBackend.get_name(), WriteFirstBackend)
    finally:
        current_source.reset(token)
    yield WriteFirstBackend.get_name()
    registries.attention_backends.drop_source(__name__)


def assert_prefill_and_decode_match(reference, model, ctx) -> None:
    """Prefill prompts of different lengths, then decode them together step by step; every
    logit row must match transformers' logits of the full sequence at that position."""
    sequences = random_sequences(reference.config.vocab_size, SEQ_LENS)
    expected = reference_logits(reference, sequences)
    batch = PagedBatch(ctx, model.num_layers, len(sequences), max(SEQ_LENS))

    prompts = [s[:n] for s, n in zip(sequences, PROMPT_LENS, strict=True)]
    hidden = batch.run(model, prompts, PROMPT_LENS)
    prefill = model.compute_logits(hidden).split(PROMPT_LENS)
    for got, want, n in zip(prefill, expected, PROMPT_LENS, strict=True):
        torch.testing.assert_close(got, want[:n], atol=FP32_ATOL, rtol=0)

    for step in range(DECODE_STEPS):
        context = [n + step + 1 for n in PROMPT_LENS]
        new_tokens = [s[c - 1:c] for s, c in zip(sequences, context, strict=True)]
        hidden = batch.run(model, new_tokens, context)
        got = model.compute_logits(hidden)
        want = torch.stack([e[c - 1] for e, c in zip(expected, context, strict=True)])
        torch.testing.assert_close(got, want, atol=FP32_ATOL, rtol=0,
                                   msg=lambda m, step=step: f"decode step {step}: {m}")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_and_decode_match_transformers(name):
    assert_prefill_and_decode_match(*reference_and_ours(CONFIGS[name]()))


def test_layer_writes_the_cache_when_the_backend_does_not(write_first_backend):
    reference, model, ctx = reference_and_ours(CONFIGS["llama"](),
                                               attention_backend=write_first_backend)
    assert ctx.attention_backend is WriteFirstBackend
    assert_prefill_and_decode_match(reference, model, ctx)


def test_chunked_prefill_mixed_with_decode():
    """One step serves a prompt's second chunk and another sequence's decode token."""
    config = CONFIGS["qwen2-window-bias"]()
    reference, model, ctx = reference_and_ours(config)
    first, second = random_sequences(config.vocab_size, (18, 7))
    expected_first, expected_second = reference_logits(reference, [first, second])
    batch = PagedBatch(ctx, model.num_layers, 2, 18)
    batch.run(model, [first[:6], second[:6]], [6, 6])
    hidden = batch.run(model, [first[6:18], second[6:7]], [18, 7])
    got = model.compute_logits(hidden)
    torch.testing.assert_close(got, torch.cat([expected_first[6:18], expected_second[6:7]]),
                               atol=FP32_ATOL, rtol=0)


def test_sliding_window_is_active_in_these_tests():
    """Guards the window tests: with the window ignored, the logits would differ."""
    config = CONFIGS["mistral-window"]()
    reference, model, ctx = reference_and_ours(config)
    (sequence,) = random_sequences(config.vocab_size, (20,))
    config.sliding_window = None
    unwindowed, _ = build_model(InMemoryCheckpoint(config, reference.state_dict()))
    batch, batch_full = (PagedBatch(ctx, model.num_layers, 1, 20) for _ in range(2))
    windowed = model.compute_logits(batch.run(model, [sequence], [20]))
    full = unwindowed.compute_logits(batch_full.run(unwindowed, [sequence], [20]))
    assert (windowed[8:] - full[8:]).abs().max() > 100 * FP32_ATOL
    torch.testing.assert_close(windowed[:8], full[:8], atol=FP32_ATOL, rtol=0)


def test_load_weights_names_missing_unexpected_and_misshaped_tensors():
    config = CONFIGS["llama"]()
    state = AutoModelForCausalLM.from_config(config).state_dict()
    del state["model.layers.1.self_attn.k_proj.weight"]
    state["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(1)
    with pytest.raises(ModelError) as error:
        build_model(InMemoryCheckpoint(config, state))
    assert "model.layers.1.self_attn.qkv_proj.weight[k]" in str(error.value)
    assert "model.layers.0.mlp.extra_proj.weight" in str(error.value)

    del state["model.layers.0.mlp.extra_proj.weight"]
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(4, 4)
    with pytest.raises(ModelError, match=r"k_proj.weight: shape \(4, 4\) does not fit"):
        build_model(InMemoryCheckpoint(config, state))


def test_bfloat16_matches_float32_reference():
    config = CONFIGS["llama"]()
    reference, model, ctx = reference_and_ours(config, dtype="bfloat16")
    sequences = random_sequences(config.vocab_size, SEQ_LENS)
    expected = torch.cat(reference_logits(reference, sequences))
    batch = PagedBatch(ctx, model.num_layers, len(sequences), max(SEQ_LENS))
    assert batch.kv_caches[0].dtype == torch.bfloat16
    got = model.compute_logits(batch.run(model, sequences, SEQ_LENS))
    assert got.dtype == torch.float32
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= BF16_RTOL * scale


@pytest.mark.slow
def test_smollm2_checkpoint_matches_transformers():
    """Greedy decoding of the real checkpoint: every step's logits and token agree."""
    checkpoint = load_checkpoint(resolve_model(None), dequantize=True)
    model, ctx = build_model(checkpoint)
    prompt = checkpoint.tokenizer("The capital of France is", return_tensors="pt").input_ids[0]
    batch = PagedBatch(ctx, model.num_layers, 1, len(prompt) + DECODE_STEPS)
    logits = [model.compute_logits(batch.run(model, [prompt], [len(prompt)]))]
    tokens = prompt
    for _ in range(DECODE_STEPS):
        tokens = torch.cat([tokens, logits[-1][-1:].argmax(-1)])
        logits.append(model.compute_logits(batch.run(model, [tokens[-1:]], [len(tokens)])))

    reference = LlamaForCausalLM(checkpoint.transformers_config()).eval()
    result = reference.load_state_dict(dict(checkpoint.weights()), strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    reference.tie_weights()
    with torch.inference_mode():
        want = reference(tokens[None]).logits[0]
    torch.testing.assert_close(torch.cat(logits), want, atol=SMOLLM2_ATOL, rtol=0)
    assert torch.equal(tokens[len(prompt):], want[len(prompt) - 1:-1].argmax(-1))
