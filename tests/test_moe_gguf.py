"""Tiny Qwen3-MoE and Mixtral models as GGUF files (llama.cpp's stacked
``ffn_{gate,up,down}_exps`` names and metadata: ``qwen3moe``, and ``llama`` with
``expert_count`` for Mixtral, written with the ``gguf`` writer): loaded kept in their
blocks they agree with the dequantized models, and in F32 hwplug, llama.cpp
(llama-cpp-python) and transformers decode the same greedy tokens.

The F32 files are of tests/test_moe_models.py's sizes; the quantized ones are llama.cpp's
Q4_K_M of models with rows of 256 values (so the experts are K-quants)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_models_vs_transformers import FP32_ATOL
from tiny_models import randomize
from tiny_moe_gguf import VOCAB, hwplug_greedy, llama_cpp_greedy, quantize_gguf, write_moe_gguf
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

from hwplug.kernel_registry import ops_moe
from hwplug.kernel_registry.reference.ggml import dequantize
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.layers.moe import GgufExperts
from hwplug.model_zoo.loaders import load_checkpoint

pytest.importorskip("llama_cpp")

SIZES = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=64, num_experts_per_tok=2)
#: name -> (config class, its own settings, (small, K-quant) sizes).
MODELS = {
    "qwen3-moe": (Qwen3MoeConfig, dict(num_experts=4, norm_topk_prob=True,
                                       architectures=["Qwen3MoeForCausalLM"]),
                  (dict(hidden_size=64, head_dim=16, intermediate_size=96,
                        moe_intermediate_size=32),
                   dict(hidden_size=256, head_dim=64, intermediate_size=256,
                        moe_intermediate_size=256))),
    "mixtral": (MixtralConfig, dict(num_local_experts=4, architectures=["MixtralForCausalLM"]),
                (dict(hidden_size=64, intermediate_size=48),
                 dict(hidden_size=256, intermediate_size=256))),
}
PROMPT = [3, 17, 99, 42, 5, 64]
STEPS = 8
#: Kept K-quant blocks against the dequantized model: largest logit difference over the
#: logits' range (the C kernels round activations to int8 per 256 values, as llama.cpp).
LOGIT_RTOL = 2e-2


def _transformers_model(name: str, quantizable: bool) -> torch.nn.Module:
    config_class, settings, sizes = MODELS[name]
    config = config_class(**SIZES, **settings, **sizes[quantizable])
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, std=0.05 if quantizable else 0.15)
    return model


def _greedy(path: Path, dequantize_all: bool = False) -> tuple[list[int], torch.Tensor]:
    return hwplug_greedy(path, PROMPT, STEPS, dequantize_all)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_f32_gguf_greedy_tokens_are_llama_cpps_and_transformers(name, tmp_path):
    reference = _transformers_model(name, quantizable=False)
    path = write_moe_gguf(reference, tmp_path / "f32.gguf")
    with torch.inference_mode():
        want = reference.generate(torch.tensor([PROMPT]), max_new_tokens=STEPS,
                                  min_new_tokens=STEPS, do_sample=False)[0, len(PROMPT):]
        want_logits = reference(torch.tensor([PROMPT])).logits[0]
    ours, logits = _greedy(path)
    assert ours == want.tolist()
    assert llama_cpp_greedy(path, PROMPT, STEPS) == ours
    torch.testing.assert_close(logits, want_logits, atol=FP32_ATOL, rtol=0)
    assert any(name.startswith("grouped_")  # kept in (F32) blocks
               for name in ops_moe.ggml_moe_experts.variants_used())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_q4_k_m_experts_kept_in_blocks_agree_with_the_dequantized_model(name, tmp_path):
    source = write_moe_gguf(_transformers_model(name, quantizable=True), tmp_path / "f32.gguf")
    path = quantize_gguf(source, tmp_path / "q4_k_m.gguf", "Q4_K_M")
    kept, _ = build_model(load_checkpoint(path), dtype="float32")
    plain, _ = build_model(load_checkpoint(path, dequantize=True), dtype="float32")
    for index, layer in enumerate(kept.model.layers):
        experts = layer.mlp.experts
        assert isinstance(experts, GgufExperts)
        w13, w13_type, w2, w2_type = experts.stacks()
        assert {w13_type, w2_type} <= {Q.Q4_K, Q.Q6_K}, (w13_type, w2_type)
        dense = plain.model.layers[index].mlp.experts
        for blocks, kind, weight in ((w13, w13_type, dense.gate_up_proj),
                                     (w2, w2_type, dense.down_proj)):
            torch.testing.assert_close(dequantize(blocks.flatten(0, 1), kind).view(weight.shape),
                                       weight, atol=0, rtol=0)
    got, want = (_greedy(path, dequantize_all)[1] for dequantize_all in (False, True))
    error = float((got - want).abs().max() / (want.max() - want.min()))
    assert error < LOGIT_RTOL, error
