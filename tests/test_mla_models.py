"""DeepSeek-V3/V2 on the latent cache (issue 26): the ``TORCH_MLA`` backend serves them,
``LLM`` gives transformers' greedy tokens with prefix caching on and off and with prefill
chunked by a small ``max_num_batched_tokens``, and the engine's cache report shows
``kv_lora_rank + qk_rope_head_dim`` values per token and layer.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import PagedBatch
from test_models_vs_transformers import reference_and_ours
from test_moe_models import CONFIGS, GREEDY_STEPS


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2"])
def test_deepseek_caches_latents_through_the_mla_backend(name):
    config = CONFIGS[name]()
    _, model, ctx = reference_and_ours(config)
    assert ctx.engine_config.attention_backend == "TORCH_MLA"
    assert ctx.attention_backend.kv_cache_shape(3, 8, 1, ctx.engine_config.head_size) == (
        3, 8, config.kv_lora_rank + config.qk_rope_head_dim)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory):
    from tiny_checkpoints import _tokenizer

    config = CONFIGS["deepseek-v3"]()
    config.eos_token_id, config.bos_token_id = 1, 0
    reference, _, _ = reference_and_ours(config)
    path = tmp_path_factory.mktemp("deepseek")
    reference.save_pretrained(path)
    _tokenizer(config.vocab_size).save_pretrained(path)
    return reference, path


def test_the_cache_report_counts_latent_bytes_per_token(deepseek_dir):
    from hwplug import LLM

    reference, path = deepseek_dir
    config = reference.config
    plan = LLM(str(path), num_kv_blocks=10).kv_cache_plan
    per_token = plan.nbytes / (plan.num_blocks * plan.block_size)
    layers, fp32 = config.num_hidden_layers, 4
    assert per_token == layers * (config.kv_lora_rank + config.qk_rope_head_dim) * fp32
    full_kv = layers * 2 * config.num_attention_heads * (
        config.qk_nope_head_dim + config.qk_rope_head_dim) * fp32  # the expanded K/V cache
    assert per_token * 6 == full_kv  # 32 values a token and layer instead of 192


SHARED = [5, 17, 3, 90, 41, 8, 8, 23, 61, 7, 2, 44, 19, 19, 80, 6]
PROMPTS = [SHARED + [12, 33, 4], SHARED + [9, 9]]


@pytest.mark.parametrize("options, hit_blocks", [
    ({"enable_prefix_caching": False}, 0),
    ({"enable_prefix_caching": True}, 2),
    ({"max_num_batched_tokens": 5, "enable_prefix_caching": False}, 0),
], ids=["no-prefix-caching", "prefix-caching", "chunked-prefill"])
def test_llm_generates_transformers_tokens(deepseek_dir, options, hit_blocks):
    """The second prompt shares 16 tokens (two blocks of 8) with the first; run one after
    the other, prefix caching reuses them. 5 tokens a step prefill each prompt in chunks
    that attend to the latents of the chunks before."""
    from hwplug import LLM, SamplingParams

    reference, path = deepseek_dir
    llm = LLM(str(path), block_size=8, **options)
    params = SamplingParams(max_tokens=GREEDY_STEPS, temperature=0.0, ignore_eos=True)
    for prompt in PROMPTS:
        (output,) = llm.generate([prompt], params)
        with torch.inference_mode():
            want = reference.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_STEPS,
                                      min_new_tokens=GREEDY_STEPS, do_sample=False)
        assert list(output.outputs[0].token_ids) == want[0, len(prompt):].tolist()
    assert llm.block_manager.num_hit_blocks == hit_blocks


def _dense_deepseek_logits(config, state, **options):
    """Logits of two 12-token prompts and 5 decode steps each, through the paged cache,
    and the model."""
    from model_harness import InMemoryCheckpoint, PagedBatch
    from test_models_vs_transformers import random_sequences

    from hwplug.model_zoo.context import build_model

    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8,
                             **options)
    sequences = random_sequences(config.vocab_size, (17, 17))
    batch = PagedBatch(ctx, model.num_layers, 2, 17)
    steps = [model.compute_logits(batch.run(model, [s[:12] for s in sequences], [12, 12]))]
    for n in range(12, 17):
        steps.append(model.compute_logits(batch.run(model, [s[n:n + 1] for s in sequences],
                                                    [n + 1, n + 1])))
    return torch.cat(steps), model


@pytest.mark.parametrize("kv_cache_dtype, calculate_kv_scales", [
    ("fp8_e4m3", True), ("fp8_e5m2", False)])
def test_an_fp8_latent_cache_tracks_the_float32_one(kv_cache_dtype, calculate_kv_scales):
    """Within FP8_KV_RTOL of the logits' range, as the standard fp8 cache (every layer's
    MLP dense here: a perturbation that flips an expert choice would move a logit by far
    more than the cache's rounding)."""
    from test_fp8_kv_cache import FP8_KV_RTOL

    config = CONFIGS["deepseek-v3"]()
    config.first_k_dense_replace = config.num_hidden_layers
    reference, _, _ = reference_and_ours(config)
    state = reference.state_dict()
    want, _ = _dense_deepseek_logits(config, state)
    got, model = _dense_deepseek_logits(config, state, kv_cache_dtype=kv_cache_dtype,
                                        calculate_kv_scales=calculate_kv_scales)
    scales = [float(layer.self_attn.attn.kv_scale) for layer in model.model.layers]
    assert (scales != [1.0] * len(scales)) == calculate_kv_scales, scales
    error = float((got - want).abs().max() / (want.max() - want.min()))
    assert 0 < error < FP8_KV_RTOL[kv_cache_dtype], error


#: Max |fp8-block logit - dequantized logit| over the dequantized logits' range: measured
#: 0.27 (every linear of this random DeepSeek quantizes its activations to fp8 per group
#: of 128; test_quant_models' Llama bound is 0.10); W_UK / W_UV are compared exactly.
FP8_BLOCK_DEEPSEEK_RTOL = 0.35


def test_an_fp8_block_kv_b_proj_is_dequantized_for_the_up_projections(tmp_path, monkeypatch):
    """DeepSeek-V3's own checkpoint format: every linear (kv_b_proj included) fp8 with
    128x128 block scales. W_UK / W_UV are exactly the written weights dequantized, and the
    model runs: its logits stay within FP8_BLOCK_DEEPSEEK_RTOL of the range of the model
    built from those dequantized weights (they differ through the fp8 activations of every
    other linear layer)."""
    import quant_formats
    from model_harness import InMemoryCheckpoint
    from test_quant_models import load

    from hwplug.model_zoo.context import build_model

    monkeypatch.setattr(quant_formats, "LINEARS", (*quant_formats.LINEARS, "q_a_proj", "q_b_proj",
                                                   "kv_a_proj_with_mqa", "kv_b_proj"))
    config = CONFIGS["deepseek-v3"]()
    config.first_k_dense_replace = config.num_hidden_layers  # dense: no expert flips
    # every quantized matrix of whole 128 x 128 blocks, at least two of them each way
    config.update(dict(hidden_size=256, intermediate_size=512, q_lora_rank=256,
                       kv_lora_rank=256, qk_nope_head_dim=32, qk_rope_head_dim=128,
                       v_head_dim=64))
    reference, _, _ = reference_and_ours(config)
    dequantized = quant_formats.write_quantized(reference.state_dict(), config.to_dict(),
                                                "fp8-block", tmp_path, {})
    model, ctx = load(tmp_path, "float32")
    want_model, _ = build_model(InMemoryCheckpoint(config, dequantized), dtype="float32",
                                block_size=8)
    attention = model.model.layers[0].self_attn
    assert attention.kv_b_proj.weight.dtype == torch.float8_e4m3fn
    prompt = torch.tensor([3, 17, 99, 42, 5, 64, 8, 1])
    logits = [m.compute_logits(PagedBatch(ctx, m.num_layers, 1, 8).run(m, [prompt], [8]))
              for m in (model, want_model)]
    w_uk, w_uv = attention._up_projections()
    written = dequantized["model.layers.0.self_attn.kv_b_proj.weight"].view(4, 96, 256)
    assert torch.equal(w_uk, written[:, :32]) and torch.equal(w_uv, written[:, 32:])
    want = logits[1]
    error = float((logits[0] - want).abs().max() / (want.max() - want.min()))
    assert 0 < error < FP8_BLOCK_DEEPSEEK_RTOL, error
