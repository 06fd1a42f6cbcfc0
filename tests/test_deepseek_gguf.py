"""DeepSeek-V3 as llama.cpp writes it (``deepseek2``: MLA metadata, ``kv_b_proj`` split per
head into ``attn_k_b``/``attn_v_b``, ``exp_probs_b``, grouped sigmoid routing, a shared
expert; tests/tiny_moe_gguf.py): hwplug builds the config from the metadata, joins the
latent up-projection back, and in F32 gives transformers' logits and greedy tokens (and
llama.cpp's, where llama-cpp-python is installed); kept in Q8_0 blocks it agrees with the
same file dequantized. Both with plain RoPE and with YaRN (llama.cpp's ``rope.scaling.*``
keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_models_vs_transformers import FP32_ATOL
from tiny_models import randomize
from tiny_moe_gguf import VOCAB, hwplug_greedy, llama_cpp_greedy, write_deepseek_gguf
from transformers import AutoModelForCausalLM, DeepseekV3Config

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders import load_checkpoint

PROMPT = [3, 17, 99, 42, 5, 64]
STEPS = 8
#: Q8_0 blocks against their dequantized values: largest logit difference over the logits'
#: range (activations rounded to int8 per 32 values in the C kernels).
Q8_LOGIT_RTOL = 1e-2


YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=0.8,
            mscale_all_dim=0.8, beta_fast=32, beta_slow=1)


def _reference(hidden: int = 64, rope_scaling: dict | None = None) -> torch.nn.Module:
    """Layer 0 dense, layer 1 sparse: 8 experts, top-3 of the best 2 of 4 groups, sigmoid
    scores with a correction bias, renormalised, scaled 2.5, one shared expert."""
    config = DeepseekV3Config(
        hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=VOCAB, max_position_embeddings=64, architectures=["DeepseekV3ForCausalLM"],
        intermediate_size=96, moe_intermediate_size=32, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8,
        num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
        rope_scaling=rope_scaling)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    randomize(model, std=0.15)
    with torch.no_grad():  # a bias that changes which experts win
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3)
    return model


def _greedy(path: Path, dequantize_all: bool = False) -> tuple[list[int], torch.Tensor]:
    return hwplug_greedy(path, PROMPT, STEPS, dequantize_all)


@pytest.fixture(scope="module", params=[None, YARN], ids=["rope", "yarn"])
def f32_file(request, tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    reference = _reference(rope_scaling=request.param)
    return reference, write_deepseek_gguf(reference, tmp_path_factory.mktemp("ds") / "f32.gguf")


@pytest.mark.parametrize("dequantize_all", [False, True], ids=["kept", "dequantized"])
def test_f32_file_gives_transformers_logits_and_greedy_tokens(f32_file, dequantize_all):
    reference, path = f32_file
    with torch.inference_mode():
        want = reference.generate(torch.tensor([PROMPT]), max_new_tokens=STEPS,
                                  min_new_tokens=STEPS, do_sample=False)[0, len(PROMPT):]
        want_logits = reference(torch.tensor([PROMPT])).logits[0]
    tokens, logits = _greedy(path, dequantize_all)
    assert tokens == want.tolist()
    torch.testing.assert_close(logits, want_logits, atol=FP32_ATOL, rtol=0)


def test_the_config_is_the_one_the_file_was_written_from(f32_file):
    reference, path = f32_file
    config = load_checkpoint(path).config
    want = reference.config
    assert config.architectures == ["DeepseekV3ForCausalLM"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
                "n_shared_experts", "first_k_dense_replace", "routed_scaling_factor",
                "norm_topk_prob", "moe_intermediate_size", "intermediate_size"):
        assert getattr(config, key) == getattr(want, key), key
    assert config.rope_parameters["rope_type"] == want.rope_parameters["rope_type"]


def test_llama_cpp_decodes_the_same_greedy_tokens(f32_file):
    pytest.importorskip("llama_cpp")
    _, path = f32_file
    assert llama_cpp_greedy(path, PROMPT, STEPS) == _greedy(path)[0]


def test_q8_0_blocks_kept_agree_with_the_dequantized_model(tmp_path):
    path = write_deepseek_gguf(_reference(hidden=128), tmp_path / "q8_0.gguf", Q.Q8_0)
    types = {name: int(tensor) for name, tensor in load_checkpoint(path).weights()
             if name.endswith("qweight_type")}
    assert types["model.layers.1.self_attn.q_a_proj.qweight_type"] == Q.Q8_0
    assert types["model.layers.1.self_attn.kv_b_proj.qweight_type"] == Q.F32
    (_, got), (_, want) = (_greedy(path, d) for d in (False, True))
    error = float((got - want).abs().max() / (want.max() - want.min()))
    assert error < Q8_LOGIT_RTOL, error


def test_a_file_missing_half_of_a_latent_up_projection_is_refused(tmp_path):
    from gguf import GGUFReader, GGUFWriter

    source = write_deepseek_gguf(_reference(), tmp_path / "f32.gguf")
    reader = GGUFReader(source)
    writer = GGUFWriter(tmp_path / "broken.gguf", "deepseek2")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            writer.add_key_value(field.name, field.contents(), field.types[0],
                                 field.types[-1] if len(field.types) > 1 else None)
    for tensor in reader.tensors:
        if tensor.name != "blk.1.attn_v_b.weight":
            writer.add_tensor(tensor.name, tensor.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelError, match="attn_k_b but not attn_v_b"):
        load_checkpoint(tmp_path / "broken.gguf")
