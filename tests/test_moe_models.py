"""Qwen3-MoE, Mixtral and DeepSeek-V3 against transformers' implementations holding the
same weights.

Tiny random configs with several experts and top-k > 1 (Qwen3-MoE with a dense layer
among the sparse ones, renormalised and not; DeepSeek-V3's latent attention over the
latent cache, prefill expanded and decode absorbed, and grouped sigmoid routing with a
shared expert): prefill and decode logits through the paged cache within FP32_ATOL of
transformers' full-sequence logits, and greedy decoding gives transformers' tokens.
Checkpoints with one tensor per expert (the published form, and Mixtral's
``block_sparse_moe`` names) load to the same model.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from test_models_vs_transformers import (
    FP32_ATOL,
    assert_prefill_and_decode_match,
    reference_and_ours,
)
from transformers import DeepseekV2Config, DeepseekV3Config, MixtralConfig, Qwen3MoeConfig

from hwplug.errors import ModelError
from hwplug.kernel_registry import ops_moe
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.layers.moe import FusedMoE

TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
CONFIGS = {
    # layer 1 dense (mlp_only_layers), layers 0 and 2 sparse: 8 experts, top-3
    "qwen3-moe": lambda: Qwen3MoeConfig(**TINY, architectures=["Qwen3MoeForCausalLM"],
                                        head_dim=32, intermediate_size=96,
                                        moe_intermediate_size=48, num_experts=8,
                                        num_experts_per_tok=3, norm_topk_prob=True,
                                        mlp_only_layers=[1]),
    "qwen3-moe-unnormalised": lambda: Qwen3MoeConfig(
        **TINY, architectures=["Qwen3MoeForCausalLM"], intermediate_size=96,
        moe_intermediate_size=32, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False),
    "mixtral": lambda: MixtralConfig(**TINY, architectures=["MixtralForCausalLM"],
                                     intermediate_size=80, num_local_experts=5,
                                     num_experts_per_tok=2),
    # latent attention (q_lora, kv_lora, interleaved RoPE on a shared key; latent cache),
    # layer 0 dense, then grouped sigmoid routing (2 of 4 groups) with a shared expert
    "deepseek-v3": lambda: DeepseekV3Config(
        **{**TINY, "num_key_value_heads": 4}, architectures=["DeepseekV3ForCausalLM"],
        intermediate_size=96, moe_intermediate_size=24, q_lora_rank=32, kv_lora_rank=24,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_scaling=None),
    # V3's own RoPE: YaRN, 4x the original 16 positions, attention and softmax scales
    # corrected (mscale 1, mscale_all_dim 0.8: cos and sin scaled by 1.025)
    "deepseek-v3-yarn": lambda: DeepseekV3Config(
        **{**TINY, "num_key_value_heads": 4}, architectures=["DeepseekV3ForCausalLM"],
        intermediate_size=96, moe_intermediate_size=24, q_lora_rank=32, kv_lora_rank=24,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                          mscale=1.0, mscale_all_dim=0.8, beta_fast=32, beta_slow=1)),
    # V2: softmax routing, not renormalised, best 2 of 4 groups by their best expert
    "deepseek-v2": lambda: DeepseekV2Config(
        **{**TINY, "num_key_value_heads": 4}, architectures=["DeepseekV2ForCausalLM"],
        intermediate_size=96, moe_intermediate_size=24, q_lora_rank=None, kv_lora_rank=24,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, topk_method="group_limited_greedy",
        n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=1.5,
        rope_scaling=None),
}
GREEDY_STEPS = 8


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_prefill_and_decode_match_transformers(name):
    reference, model, ctx = reference_and_ours(CONFIGS[name]())
    assert_prefill_and_decode_match(reference, model, ctx)
    assert "grouped" in ops_moe.fused_moe.variants_used()


def greedy(model, ctx, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` greedy tokens after ``prompt``, through the paged cache."""
    batch = PagedBatch(ctx, model.num_layers, 1, len(prompt) + steps)
    logits = model.compute_logits(batch.run(model, [prompt], [len(prompt)]))
    tokens = prompt
    for _ in range(steps):
        tokens = torch.cat([tokens, logits[-1:].argmax(-1)])
        logits = model.compute_logits(batch.run(model, [tokens[-1:]], [len(tokens)]))
    return tokens[len(prompt):]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_tokens_are_transformers(name):
    reference, model, ctx = reference_and_ours(CONFIGS[name]())
    prompt = torch.tensor([3, 17, 99, 42, 5, 64])
    with torch.inference_mode():
        want = reference.generate(prompt[None], max_new_tokens=GREEDY_STEPS, do_sample=False,
                                  min_new_tokens=GREEDY_STEPS)[0, len(prompt):]
    assert torch.equal(greedy(model, ctx, prompt, GREEDY_STEPS), want)


def _per_expert(state: dict[str, torch.Tensor], names: tuple[str, str, str], block: str
                ) -> dict[str, torch.Tensor]:
    """transformers' stacked experts as the published checkpoints store them."""
    out = {}
    for key, tensor in state.items():
        prefix, _, param = key.rpartition(".")
        if param == "gate_up_proj":
            for e, rows in enumerate(tensor):
                gate, up = rows.chunk(2)
                out[f"{prefix}.{e}.{names[0]}.weight"] = gate
                out[f"{prefix}.{e}.{names[1]}.weight"] = up
        elif param == "down_proj" and prefix.endswith(".experts"):
            for e, rows in enumerate(tensor):
                out[f"{prefix}.{e}.{names[2]}.weight"] = rows
        else:
            out[key] = tensor
    return {k.replace(".mlp.", f".{block}.") if ".mlp.gate" in k or ".experts." in k else k: v
            for k, v in out.items()}


@pytest.mark.parametrize("name, names, block", [
    ("qwen3-moe", ("gate_proj", "up_proj", "down_proj"), "mlp"),
    ("mixtral", ("w1", "w3", "w2"), "block_sparse_moe"),
])
def test_per_expert_checkpoints_load_to_the_same_model(name, names, block):
    config = CONFIGS[name]()
    reference, model, ctx = reference_and_ours(config)
    state = _per_expert(reference.state_dict(), names, block)
    assert not any(k.endswith("gate_up_proj") for k in state)
    loaded, _ = build_model(InMemoryCheckpoint(config, state))
    for ours, theirs in zip(model.state_dict().values(), loaded.state_dict().values(),
                            strict=True):
        assert torch.equal(ours, theirs)
    prompt = torch.tensor([1, 2, 3])
    outs = [m.compute_logits(PagedBatch(ctx, m.num_layers, 1, 3).run(m, [prompt], [3]))
            for m in (model, loaded)]
    torch.testing.assert_close(outs[0], outs[1], atol=FP32_ATOL, rtol=0)


def test_a_checkpoint_missing_an_expert_names_it():
    config = CONFIGS["qwen3-moe"]()
    reference, _, _ = reference_and_ours(config)
    state = _per_expert(reference.state_dict(), ("gate_proj", "up_proj", "down_proj"), "mlp")
    del state["model.layers.2.mlp.experts.5.up_proj.weight"]
    with pytest.raises(ModelError, match=r"model.layers.2.mlp.experts: up of expert 5"):
        build_model(InMemoryCheckpoint(config, state))


def test_the_sparse_layers_are_the_configs():
    _, model, _ = reference_and_ours(CONFIGS["qwen3-moe"]())
    kinds = [isinstance(layer.mlp, FusedMoE) for layer in model.model.layers]
    assert kinds == [True, False, True]


def test_a_saved_checkpoint_generates_transformers_tokens_through_llm(tmp_path):
    """transformers' ``save_pretrained`` writes one tensor per expert (the published form);
    the directory loads (its expert shapes checked against ``moe_intermediate_size``) and
    ``LLM.generate`` decodes greedily, batched with another prompt, as transformers."""
    from tiny_checkpoints import _tokenizer

    from hwplug import LLM, SamplingParams

    config = CONFIGS["qwen3-moe"]()
    config.eos_token_id, config.bos_token_id = 1, 0
    reference, _, _ = reference_and_ours(config)
    reference.save_pretrained(tmp_path)
    _tokenizer(config.vocab_size).save_pretrained(tmp_path)
    prompts = [[5, 17, 3, 90, 41], [61, 7, 7]]
    outputs = LLM(str(tmp_path)).generate(prompts, SamplingParams(max_tokens=GREEDY_STEPS,
                                                                  temperature=0.0,
                                                                  ignore_eos=True))
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            want = reference.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_STEPS,
                                      min_new_tokens=GREEDY_STEPS, do_sample=False)
        assert list(output.outputs[0].token_ids) == want[0, len(prompt):].tolist()


def test_a_deepseek_v3_style_layer_matches_transformers_block():
    """FusedMoE with sigmoid scores, a correction bias, grouped top-k (2 of 4 groups), a
    routed scaling factor and a shared expert, loaded from transformers' DeepseekV3MoE."""
    from transformers import DeepseekV3Config, LlamaConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    from hwplug.discovery import current_platform
    from hwplug.model_zoo.context import create_context
    from hwplug.model_zoo.layers import fused_target, load_named_weights
    from hwplug.model_zoo.models.llama import FUSED_MODULES, LlamaForCausalLM

    config = DeepseekV3Config(hidden_size=64, moe_intermediate_size=24, n_routed_experts=8,
                              num_experts_per_tok=3, n_group=4, topk_group=2,
                              n_shared_experts=1, routed_scaling_factor=2.5,
                              norm_topk_prob=True)
    block = DeepseekV3MoE(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in [*block.parameters(), *block.buffers()]:
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.3)
    ctx = create_context(LlamaForCausalLM, LlamaConfig(**TINY), current_platform())
    layer = FusedMoE(ctx, num_experts=8, top_k=3, hidden_size=64, intermediate_size=24,
                     scoring="sigmoid", correction_bias=True, num_expert_group=4, topk_group=2,
                     routed_scaling_factor=2.5, shared_intermediate_size=24)
    load_named_weights(layer, block.state_dict().items(),
                       lambda name: fused_target(name, FUSED_MODULES))
    x = torch.randn(9, 64, generator=generator)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), block(x[None])[0], atol=1e-5, rtol=1e-5)
        layer.shared_experts.down_proj.weight.zero_()  # the shared expert counts
        assert (layer(x) - block(x[None])[0]).abs().max() > 1e-2


def test_experts_of_another_quant_method_are_refused_naming_the_supported_ones():
    from dataclasses import replace

    from transformers import LlamaConfig

    from hwplug.discovery import current_platform
    from hwplug.errors import UnsupportedError
    from hwplug.model_zoo.context import create_context
    from hwplug.model_zoo.models.llama import LlamaForCausalLM
    from hwplug.model_zoo.quant_methods.scaled import Fp8LinearMethod

    ctx = create_context(LlamaForCausalLM, LlamaConfig(**TINY), current_platform())
    fp8 = replace(ctx, quant_method=Fp8LinearMethod.from_config(None))
    with pytest.raises(UnsupportedError, match=r"quant method 'fp8' .* unquantized, gguf"):
        FusedMoE(fp8, num_experts=4, top_k=2, hidden_size=64, intermediate_size=32)

