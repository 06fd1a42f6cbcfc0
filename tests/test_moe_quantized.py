"""fp8 block-scaled and int8 W8A8 experts: the ops' references against the unquantized
experts, and tiny Qwen3-MoE and DeepSeek-V3 checkpoints written in those formats against
the same models on their dequantized weights.

Checkpoints are written as their producers write them (``quant_formats``: DeepSeek-V3's
``quant_method: fp8`` with 128x128 ``weight_scale_inv``, compressed-tensors int8 W8A8),
experts one tensor per expert as the published checkpoints hold them; every projection
of every layer is quantized, the router ``gate`` is not. hwplug's unquantized model on the
dequantized weights is transformers' within fp32 rounding (tests/test_moe_models.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import quant_formats
import torch
from model_harness import InMemoryCheckpoint, greedy_steps
from test_moe_models import CONFIGS, _per_expert
from test_quant_models import load
from tiny_models import randomize
from transformers import AutoModelForCausalLM

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import ops_moe
from hwplug.kernel_registry.reference import moe, moe_quant
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.layers.moe_quant import ScaledExperts

#: Max |quantized logit - dequantized logit| over the dequantized logits' range, per model
#: and format. The fp8 experts add nothing of their own (activations stay fp32: the routed
#: experts match the dequantized ones to FP8_LAYER_ATOL, checked below); what is left is
#: the fp8 activations (per token group of 128) of every dense linear (attention, shared
#: experts), and for int8 every linear's and expert's per-token int8 activations; MLA's
#: chain of low-rank projections amplifies them (tests/test_mla_models.py bounds fp8-block
#: DeepSeek at 0.35 too). Measured (torch 2.13, CPU): Qwen3-MoE 0.110 (fp8) / 0.047
#: (int8), DeepSeek-V3 0.294 / 0.175.
LOGIT_RTOL = {("qwen3-moe", "fp8-block"): 0.15, ("qwen3-moe", "int8-w8a8"): 0.07,
              ("deepseek-v3", "fp8-block"): 0.35, ("deepseek-v3", "int8-w8a8"): 0.25}
#: Prompts (of NUM_PROMPTS) whose NEW_TOKENS greedy tokens, fed the dequantized model's,
#: are all identical: the dense layers' quantized activations flip a random tiny model's
#: near-ties (test_quant_models asks 17 of 32 of fp8 Llamas). Measured: Qwen3-MoE 10 / 14,
#: DeepSeek-V3 8 / 10 of 16.
MIN_SAME_PROMPTS = {("qwen3-moe", "fp8-block"): 8, ("qwen3-moe", "int8-w8a8"): 12,
                    ("deepseek-v3", "fp8-block"): 6, ("deepseek-v3", "int8-w8a8"): 8}
NUM_PROMPTS, PROMPT_LEN, NEW_TOKENS = 16, 8, 3
#: MoE layer outputs on the same input, quantized fp8 experts vs dequantized ones.
FP8_LAYER_ATOL = 1e-4

#: Sizes multiples of 128 everywhere (whole fp8 tiles; 2 tiles of the hidden size).
QWEN = dict(hidden_size=256, head_dim=64, intermediate_size=256, moe_intermediate_size=128,
            vocab_size=64)
DEEPSEEK = dict(hidden_size=256, intermediate_size=512, q_lora_rank=256, kv_lora_rank=256,
                qk_nope_head_dim=32, qk_rope_head_dim=128, v_head_dim=64,
                moe_intermediate_size=128, vocab_size=64)
MLA_LINEARS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")


def _config(name: str):
    config = CONFIGS[name]()
    config.update(QWEN if name == "qwen3-moe" else DEEPSEEK)
    return config


def _written(name: str, fmt: str, tmp_path, monkeypatch):
    """``(config, quantized model, its ctx, dequantized state dict)`` of a tiny ``name``
    written in ``fmt`` with one tensor per expert."""
    monkeypatch.setattr(quant_formats, "LINEARS", (*quant_formats.LINEARS, *MLA_LINEARS))
    config = _config(name)
    reference = AutoModelForCausalLM.from_config(config).eval()
    randomize(reference, std=0.08)
    state = _per_expert(reference.state_dict(), ("gate_proj", "up_proj", "down_proj"), "mlp")
    dequantized = quant_formats.write_quantized(state, config.to_dict(), fmt, tmp_path, {})
    model, ctx = load(tmp_path, "float32")
    return config, model, ctx, dequantized


@pytest.mark.parametrize("fmt", ["fp8-block", "int8-w8a8"])
@pytest.mark.parametrize("name", ["qwen3-moe", "deepseek-v3"])
def test_a_quantized_moe_checkpoint_tracks_its_dequantized_weights(name, fmt, tmp_path,
                                                                   monkeypatch):
    config, model, ctx, dequantized = _written(name, fmt, tmp_path, monkeypatch)
    sparse = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "experts")]
    assert sparse and all(isinstance(m.experts, ScaledExperts) for m in sparse)
    assert sparse[0].experts.gate_up_proj.dtype == (torch.float8_e4m3fn if fmt == "fp8-block"
                                                    else torch.int8)
    assert sparse[0].gate.weight.dtype == torch.float32  # the router stays unquantized
    want_model, want_ctx = build_model(InMemoryCheckpoint(config, dequantized),
                                       dtype="float32", block_size=8)
    prompts = torch.randint(0, config.vocab_size, (NUM_PROMPTS, PROMPT_LEN),
                            generator=torch.Generator().manual_seed(1))
    want, want_tokens = greedy_steps(want_model, want_ctx, prompts, NEW_TOKENS)
    got, got_tokens = greedy_steps(model, ctx, prompts, NEW_TOKENS, feed=want_tokens)
    error = float((got - want).abs().max() / (want.max() - want.min()))
    same = int((got_tokens == want_tokens).all(dim=1).sum())
    assert 0 < error < LOGIT_RTOL[(name, fmt)], error
    assert same >= MIN_SAME_PROMPTS[(name, fmt)], (same, NUM_PROMPTS)
    op = ops_moe.fp8_moe_experts if fmt == "fp8-block" else ops_moe.int8_moe_experts
    assert "grouped" in op.variants_used()
    if fmt == "fp8-block":  # the routed experts alone: the dequantized ones, in fp32
        layer = next(i for i, layer in enumerate(model.model.layers)
                     if hasattr(layer.mlp, "experts"))
        x = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(2))
        with torch.inference_mode():
            outs = [m.model.layers[layer].mlp._routed(x) for m in (model, want_model)]
        torch.testing.assert_close(outs[0], outs[1], atol=FP8_LAYER_ATOL, rtol=0)


def test_the_references_dequantize_what_was_written():
    """fp8: the reference equals the unquantized experts on the dequantized tiles
    (partial edge tiles included); int8 with activations that are already int8 steps
    (so per-token quantization is exact), the unquantized experts' output."""
    rng = torch.Generator().manual_seed(3)
    experts, hidden, inter, tokens = 5, 48, 20, 7
    x = torch.randn(tokens, hidden, generator=rng)
    weights, ids = moe.moe_topk(torch.randn(tokens, experts, generator=rng) * 3, 2)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=rng).to(torch.float8_e4m3fn)
    w2 = torch.randn(experts, hidden, inter, generator=rng).to(torch.float8_e4m3fn)
    s13 = torch.rand(experts, 3, 3, generator=rng) + 0.5  # 16x16 tiles: 40 -> 3, 48 -> 3
    s2 = torch.rand(experts, 3, 2, generator=rng) + 0.5   # 48 -> 3, 20 -> 2
    tile = torch.ones(16, 16)
    up = w13.float() * torch.kron(s13, tile)[:, :2 * inter, :hidden]
    down = w2.float() * torch.kron(s2, tile)[:, :hidden, :inter]
    torch.testing.assert_close(
        moe_quant.fp8_moe_experts(x, w13, s13, w2, s2, weights, ids, block_shape=(16, 16)),
        moe.moe_experts(x, up, down, weights, ids), rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedError, match=r"w13 scales must be float32 \[5, 3, 3\]"):
        moe_quant.fp8_moe_experts(x, w13, s13[:, :2], w2, s2, weights, ids, block_shape=(16, 16))
    q13 = torch.randint(-127, 128, (experts, 2 * inter, hidden), generator=rng,
                        dtype=torch.int8)
    q2 = torch.randint(-127, 128, (experts, hidden, inter), generator=rng, dtype=torch.int8)
    c13, c2 = torch.rand(experts, 2 * inter, generator=rng), torch.rand(experts, hidden,
                                                                        generator=rng)
    steps = torch.randint(-127, 128, (tokens, hidden), generator=rng).float()
    steps[:, 0] = 127  # amax 127: the per-token scale is 1, x quantizes to itself
    got = moe_quant.int8_moe_experts(steps, q13, c13, q2, c2, weights, ids)
    ref = moe.moe_experts(steps, q13.float() * c13[..., None], q2.float() * c2[..., None],
                          weights, ids)
    # the intermediate is quantized too: within its int8 steps' effect
    assert float((got - ref).abs().max()) < 0.02 * float(ref.abs().max())


def test_other_expert_formats_are_refused_with_the_supported_list(tmp_path, monkeypatch):
    """fp8 per-tensor experts are a typed error naming what is supported."""
    monkeypatch.setattr(quant_formats, "LINEARS", (*quant_formats.LINEARS, *MLA_LINEARS))
    config = _config("qwen3-moe")
    reference = AutoModelForCausalLM.from_config(config).eval()
    randomize(reference, std=0.08)
    state = _per_expert(reference.state_dict(), ("gate_proj", "up_proj", "down_proj"), "mlp")
    quant_formats.write_quantized(state, config.to_dict(), "fp8-channel-token", tmp_path, {})
    with pytest.raises(UnsupportedError, match=r"supported: unquantized, gguf, fp8 with block "
                                               r"scales.*int8 W8A8"):
        load(tmp_path, "float32")


def test_hwplug_kernels_reports_the_quantized_expert_variants():
    out = subprocess.run([sys.executable, "-m", "hwplug", "kernels", "--json", "--op",
                          "fp8_moe_experts", "--op", "int8_moe_experts", "--dtype", "bfloat16"],
                         capture_output=True, text=True, check=True)
    ops = json.loads(out.stdout)["ops"]
    for op in ("fp8_moe_experts", "int8_moe_experts"):
        assert ops[op]["bfloat16"]["chosen"] == "grouped"
        assert ops[op]["bfloat16"]["fallbacks"] == ["reference"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_fp8_dequantizer_is_the_references_for_every_code(dtype):
    """Every finite e4m3 code (subnormals, both zeros, the largest) in whole and partial
    tiles: the cpu variant's bit-moving dequantizer equals the reference's in fp32 (and its
    rounding to bf16)."""
    from hwplug.platforms.cpu.moe import dequantize_fp8

    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[torch.isfinite(codes.float())]
    rng = torch.Generator().manual_seed(4)
    for rows, cols in ((256, 128), (40, 24)):
        values = codes[torch.randint(0, len(codes), (rows, cols), generator=rng)]
        values[0, :len(codes) % cols] = codes[:len(codes) % cols]
        scale = torch.rand(-(-rows // 16), -(-cols // 16), generator=rng) + 0.5
        want = moe_quant.dequantize_blocks(values, scale, (16, 16)).to(dtype)
        assert torch.equal(dequantize_fp8(values, scale, (16, 16), dtype), want)
