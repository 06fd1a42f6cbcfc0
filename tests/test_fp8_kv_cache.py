"""fp8 KV caches with per-tensor and per-head k/v scales, in a whole model.

A tiny random Llama runs a prefill and decode steps with a float32 cache and with fp8
caches; fp8 logits must stay within :data:`FP8_KV_RTOL` of the float32 ones (relative to
the logits' range: e4m3 keeps 3 mantissa bits of every cached value) and pick the same
next token nearly everywhere. Scales calculated from the first batch and the same scales
loaded from a checkpoint (under the names producers write) give identical logits.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from tiny_models import random_weights
from transformers import LlamaConfig

from hwplug.dtypes import is_quantized_kv_cache
from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import build_model

#: Max |fp8-cache logit - fp32-cache logit| over the fp32 logits' range.
FP8_KV_RTOL = {"fp8_e4m3": 0.06, "fp8_e5m2": 0.15}
#: Greedy next tokens that must agree with the fp32 cache's (of 3 prompts x 5 positions).
MIN_AGREEMENT = 0.9
TINY = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                   max_position_embeddings=64, architectures=["LlamaForCausalLM"])
PROMPT_LENS, DECODE_STEPS = (13, 9, 5), 4


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return random_weights(TINY)


def logits(state: dict[str, torch.Tensor], kv_cache_dtype: str, **options):
    """Per-step logits of prompts then greedy-fed decode tokens (the tokens fed are fixed
    by the seed, so every cache dtype sees the same inputs), and the built model."""
    model, ctx = build_model(InMemoryCheckpoint(TINY, state), dtype="float32", block_size=8,
                             kv_cache_dtype=kv_cache_dtype, **options)
    batch = PagedBatch(ctx, TINY.num_hidden_layers, len(PROMPT_LENS),
                       max(PROMPT_LENS) + DECODE_STEPS)
    tokens = torch.randint(0, TINY.vocab_size, (len(PROMPT_LENS), max(PROMPT_LENS) + DECODE_STEPS),
                           generator=torch.Generator().manual_seed(1))
    chunks = [tokens[i, :n] for i, n in enumerate(PROMPT_LENS)]
    lens = list(PROMPT_LENS)
    steps = []
    with torch.inference_mode():
        for _ in range(DECODE_STEPS + 1):
            hidden = batch.run(model, chunks, lens)
            last = torch.tensor([len(c) for c in chunks]).cumsum(0) - 1
            steps.append(model.compute_logits(hidden[last]))
            chunks = [tokens[i, n:n + 1] for i, n in enumerate(lens)]
            lens = [n + 1 for n in lens]
    return torch.stack(steps), model


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_an_fp8_cache_with_calculated_scales_tracks_the_fp32_cache(state, kv_cache_dtype,
                                                                  granularity):
    want, _ = logits(state, "float32")
    got, model = logits(state, kv_cache_dtype, calculate_kv_scales=True,
                        kv_scale_granularity=granularity)
    attn = model.model.layers[0].self_attn.attn
    assert is_quantized_kv_cache(kv_cache_dtype) and attn.backend.k_scale is attn.k_scale
    heads_differ = bool((attn.k_scale != attn.k_scale[0]).any())
    assert heads_differ == (granularity == "head")
    error = float((got - want).abs().max() / (want.max() - want.min()))
    assert error < FP8_KV_RTOL[kv_cache_dtype], error
    agreement = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    assert agreement >= MIN_AGREEMENT, agreement


@pytest.mark.parametrize("names", [("self_attn.k_scale", "self_attn.v_scale"),
                                   ("self_attn.k_proj.output_scale",
                                    "self_attn.v_proj.output_scale")])
def test_checkpoint_scales_load_under_producer_names_and_reproduce_calculated_ones(state,
                                                                                   names):
    calculated, model = logits(state, "fp8_e4m3", calculate_kv_scales=True,
                               kv_scale_granularity="head")
    with_scales = dict(state)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn.attn
        with_scales[f"model.layers.{i}.{names[0]}"] = attn.k_scale.detach().clone()
        with_scales[f"model.layers.{i}.{names[1]}"] = attn.v_scale.detach().clone()
    loaded, reloaded = logits(with_scales, "fp8_e4m3")
    for ours, theirs in zip(reloaded.model.layers, model.model.layers, strict=True):
        assert torch.equal(ours.self_attn.attn.k_scale, theirs.self_attn.attn.k_scale)
    torch.testing.assert_close(loaded, calculated, atol=0, rtol=0)


def test_a_per_tensor_checkpoint_scale_fills_every_head(state):
    with_scales = {**state, "model.layers.0.self_attn.k_scale": torch.tensor(0.02)}
    _, model = logits(with_scales, "fp8_e4m3")
    assert model.model.layers[0].self_attn.attn.k_scale.tolist() == pytest.approx([0.02] * 2)
    assert model.model.layers[1].self_attn.attn.k_scale.tolist() == [1.0, 1.0]  # absent: 1


def test_bad_kv_scales_are_typed_errors(state):
    with pytest.raises(ModelError, match="k_scale has 3 values; expected 1 .* or 2"):
        logits({**state, "model.layers.0.self_attn.k_scale": torch.ones(3)}, "fp8_e4m3")
    with pytest.raises(ConfigError, match="kv_scale_granularity must be one of tensor, head, "
                                          "got 'row'"):
        logits(state, "fp8_e4m3", calculate_kv_scales=True, kv_scale_granularity="row")
