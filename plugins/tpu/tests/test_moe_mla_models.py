"""Qwen3-MoE, Mixtral and DeepSeek-V2/V3 on the tpu platform (JAX's CPU standing in)
against transformers.

The tiny random configs of ``tests/test_moe_models`` (several experts, top-k > 1;
DeepSeek-V3's grouped sigmoid routing with a correction bias and a shared expert, V2's
unrenormalised grouped softmax routing; latent attention over the latent cache) run here
on the tpu platform, float32: prefill and decode logits through the paged cache within
``FP32_ATOL`` (1e-4) of transformers' full-sequence logits, and greedy decoding gives
transformers' tokens. Every MoE op runs hwplug-tpu's JAX variant, and DeepSeek's
attention is ``JAX_MLA`` (the latent cache written and read by the JAX MLA variants:
prefill expanded, decode absorbed). Through ``hwplug.LLM`` the same models' prefill and
decode steps are compiled whole (one XLA program per bucket, sampling on the device) and
give transformers' greedy tokens.
"""

from __future__ import annotations

import pytest
import test_moe_models as on_any_platform
import torch
from test_models_vs_transformers import assert_prefill_and_decode_match, reference_and_ours

from hwplug import kernels
from hwplug_tpu.step import RECORDER

PROMPT = torch.tensor([3, 17, 99, 42, 5, 64])
#: The configs run here (``qwen3-moe-unnormalised``'s routing is DeepSeek-V2's, not
#: renormalised; the kernel tests cover it too).
MODELS = ("deepseek-v2", "deepseek-v3", "mixtral", "qwen3-moe")


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_logits_and_greedy_tokens_match_transformers(stand_in, name):
    reference, model, ctx = reference_and_ours(on_any_platform.CONFIGS[name]())
    assert_prefill_and_decode_match(reference, model, ctx)
    steps = on_any_platform.GREEDY_STEPS
    with torch.inference_mode():
        want = reference.generate(PROMPT[None], max_new_tokens=steps, do_sample=False,
                                  min_new_tokens=steps)[0, len(PROMPT):]
    assert torch.equal(on_any_platform.greedy(model, ctx, PROMPT, steps), want)
    ops = ["fused_moe", "rms_norm", "linear", "embedding", "rotary_embedding"]
    if name.startswith("deepseek"):
        assert ctx.attention_backend.get_name() == "JAX_MLA"
        ops += ["concat_and_cache_mla", "mla_attention"]
    else:
        assert ctx.attention_backend.get_name() == "PALLAS_RPA"
    for op in ops:
        assert kernels.op(op).variants_used() == {"jax"}, op


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3-moe"])
def test_llm_compiles_whole_steps_with_transformers_tokens(stand_in, tmp_path, name):
    from tiny_checkpoints import _tokenizer

    from hwplug import LLM, SamplingParams

    config = on_any_platform.CONFIGS[name]()
    config.eos_token_id, config.bos_token_id = 1, 0
    reference, _, _ = reference_and_ours(config)
    reference.save_pretrained(tmp_path)
    _tokenizer(config.vocab_size).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), block_size=8, max_model_len=32, max_num_seqs=2)
    compiled = len(RECORDER.compiled)
    prompts = [[5, 17, 3, 90, 41, 8, 12], [9, 9, 23]]
    steps = on_any_platform.GREEDY_STEPS
    outputs = llm.generate(prompts, SamplingParams(max_tokens=steps, temperature=0.0,
                                                   ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            want = reference.generate(torch.tensor([prompt]), max_new_tokens=steps,
                                      min_new_tokens=steps, do_sample=False)
        assert list(output.outputs[0].token_ids) == want[0, len(prompt):].tolist()
    # one prefill bucket and one decode bucket, compiled whole; every token sampled there
    assert len(RECORDER.compiled) - compiled == 2
    sampling = llm.runner.device_sampling
    assert sampling.device_steps == steps and not any(sampling.host_steps.values())
