"""The one-C-call MoE kernels (platforms/cpu/fused_moe): ``moe_topk``, ``moe_experts`` and
``ggml_moe_experts`` against the ops' references (the same token -> expert choice exactly;
outputs within the ops' tolerances), every token's output bitwise the same alone as in a
batch, bad routing refused with a typed error, and a tiny Qwen3-MoE through ``LLM``: its
decode steps replay as step graphs and give the greedy tokens of eager steps with these
variants off. Small shapes: the whole file runs in seconds.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_cpu_moe import _quantized
from test_models_vs_transformers import reference_and_ours
from test_moe_models import CONFIGS

import hwplug
from hwplug import current_platform, kernels
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import ops_moe
from hwplug.kernel_registry.reference import moe as reference
from hwplug.platforms.cpu.fused_moe import ops

EXPERTS, HIDDEN, INTERMEDIATE, TOP_K = 8, 64, 48, 3
#: The variants this file checks (op/name), as HWPLUG_DISABLED_KERNELS names them.
C_VARIANTS = ("moe_topk/fused_avx2", "moe_topk/fused_c", "moe_experts/fused_avx2",
              "moe_experts/fused_c", "ggml_moe_experts/fused_vnni",
              "ggml_moe_experts/fused_avx2", "ggml_moe_experts/fused_c")


def _variant(key: str):
    """The cpu plugin's variant ``key``, its C libraries built (skipped where this CPU
    lacks the build's features)."""
    variant = kernels.get(key)
    if reason := variant.device_rejection(current_platform()):
        pytest.skip(f"{key}: {reason}")
    variant.load()
    variant.native.ensure_built()
    return variant


def _routing(tokens: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, HIDDEN, generator=generator),
            torch.randn(tokens, EXPERTS, generator=generator))


@pytest.mark.parametrize("name", ["fused_avx2", "fused_c"])
@pytest.mark.parametrize("renormalize, scale", [(True, 1.0), (False, 2.5)])
def test_topk_chooses_the_reference_experts(name, renormalize, scale):
    variant = _variant(f"moe_topk/{name}")
    logits = torch.randn(37, 2 * EXPERTS, generator=torch.Generator().manual_seed(3))
    strided = logits[:, :EXPERTS]  # rows of a wider tensor: read in place
    for rows in (logits, strided):
        args = (rows, TOP_K, renormalize)
        assert variant.supports(*args, routed_scaling_factor=scale) is None
        weights, ids = variant.impl(*args, routed_scaling_factor=scale)
        want_weights, want_ids = reference.moe_topk(*args, routed_scaling_factor=scale)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-6)


def test_topk_declines_what_the_reference_serves():
    variant = _variant("moe_topk/fused_avx2")
    logits = torch.randn(2, EXPERTS)
    assert "softmax" in variant.supports(logits, 2, scoring="sigmoid")
    assert "correction_bias" in variant.supports(logits, 2, correction_bias=torch.zeros(EXPERTS))
    assert "float32" in variant.supports(logits.bfloat16(), 2)
    assert "top_k" in variant.supports(logits, EXPERTS + 1)


def _experts(seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator) / 8,
            torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=generator) / 8)


@pytest.mark.parametrize("name", ["fused_avx2", "fused_c"])
@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_experts_match_the_reference_and_rows_do_not_depend_on_the_batch(name, activation):
    """fp32 within the op's tolerance (2e-4); each token's output bitwise the same alone."""
    variant = _variant(f"moe_experts/{name}")
    w13, w2 = _experts()
    x, logits = _routing(16)
    weights, ids = reference.moe_topk(logits, TOP_K)
    got = variant.impl(x, w13, w2, weights, ids, activation)
    torch.testing.assert_close(got, reference.moe_experts(x, w13, w2, weights, ids, activation),
                               rtol=2e-4, atol=2e-4)
    assert got.abs().max() > 0.1
    for t in (0, 9, 15):
        alone = variant.impl(x[t:t + 1], w13, w2, weights[t:t + 1], ids[t:t + 1], activation)
        assert torch.equal(alone[0], got[t])


def test_experts_refuse_bad_ids_and_layouts_with_reasons():
    variant = _variant("moe_experts/fused_avx2")
    w13, w2 = _experts()
    x, logits = _routing(2)
    weights, ids = reference.moe_topk(logits, TOP_K)
    with pytest.raises(UnsupportedError, match="expert id outside"):
        ops.AVX2.moe_experts(x, w13, w2, weights, ids + EXPERTS)
    assert "int64" in variant.supports(x, w13, w2, weights, ids.int())
    assert "float32" in variant.supports(x, w13.bfloat16(), w2, weights, ids)
    assert "do not fit" in variant.supports(x, w13, w2[:, :, :8].contiguous(), weights, ids)
    assert "non-contiguous" in variant.supports(x, w13, w2[:, :, :8], weights, ids)


# the GGUF builds this CPU runs (the portable pairing is the same C code, another pointer;
# its GGUF build alone takes ~25 s to compile)
@pytest.mark.parametrize("name", ["fused_vnni", "fused_avx2"])
def test_gguf_experts_match_the_grouped_variant_and_the_reference(name):
    """Each row through the same GGUF kernel build as the grouped variant (outputs within
    1e-5; the activation differs in the last bits), within the op's tolerance of the
    reference, and bitwise the same alone as in a batch of 7."""
    grouped = _variant(f"ggml_moe_experts/{name.replace('fused', 'grouped')}")  # loads
    variant = _variant(f"ggml_moe_experts/{name}")  # the GGUF build it calls
    w13 = _quantized(Q.Q4_K, 2 * 256, 256, seed=2)
    w2 = _quantized(Q.Q6_K, 256, 256, seed=3)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(7, 256, generator=generator)
    weights, ids = reference.moe_topk(torch.randn(7, EXPERTS, generator=generator), TOP_K)
    args = (x, w13, int(Q.Q4_K), w2, int(Q.Q6_K), weights, ids)
    assert variant.supports(*args) is None
    got = variant.impl(*args)
    torch.testing.assert_close(got, grouped.impl(*args), rtol=1e-5, atol=1e-5)
    tolerance = ops_moe.ggml_moe_experts.tolerances["float32"]
    torch.testing.assert_close(got, reference.ggml_moe_experts(*args), rtol=tolerance[0],
                               atol=tolerance[1])
    for t in (0, 6):
        alone = variant.impl(x[t:t + 1], w13, int(Q.Q4_K), w2, int(Q.Q6_K), weights[t:t + 1],
                             ids[t:t + 1])
        assert torch.equal(alone[0], got[t])
    many = torch.randn(ops.MAX_GGUF_TOKENS + 1, 256)
    assert "tokens" in variant.supports(many, *args[1:5], *reference.moe_topk(
        torch.randn(len(many), EXPERTS), TOP_K))


PROMPTS = [[5, 17, 3, 90, 41], [61, 7, 7]]


def _generate(path: str, **options: object) -> tuple[list[list[int]], hwplug.LLM]:
    llm = hwplug.LLM(path, max_num_seqs=2, **options)
    params = hwplug.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params) + llm.generate(PROMPTS[:1], params)
    return [list(o.outputs[0].token_ids) for o in outputs], llm


def test_a_qwen3_moe_decode_step_replays_and_gives_the_eager_tokens(tmp_path, monkeypatch,
                                                                      fresh_discovery):
    """The C variants on, decode steps of two sequences (q/k-norm rows apart: the token-rows
    rms_norm) and of one replay a recorded step; the greedy tokens equal eager steps with
    the C variants off (the grouped MoE variants)."""
    from tiny_checkpoints import _tokenizer

    _variant("moe_experts/fused_avx2")
    config = CONFIGS["qwen3-moe"]()
    config.eos_token_id, config.bos_token_id = 1, 0
    model, _, _ = reference_and_ours(config)
    model.save_pretrained(tmp_path)
    _tokenizer(config.vocab_size).save_pretrained(tmp_path)
    tokens, llm = _generate(str(tmp_path))
    try:
        assert sorted(llm.runner.graphs.recorded) == [1, 2], llm.runner.graphs.describe()
        assert llm.runner.graphs.replays > 0
        assert {"fused_avx2"} <= set(ops_moe.moe_experts.variants_used())
    finally:
        llm.close()
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", ",".join(C_VARIANTS))
    eager, llm = _generate(str(tmp_path), step_graphs=False)
    llm.close()
    assert eager == tokens


def test_gguf_f32_rows_take_the_fp32_c_linear():
    """A GGUF F32 matrix (llama.cpp's MoE router, ``ffn_gate_inp``) through ``ggml_linear``:
    the fp32 C linear on the rows as floats, within 1e-5 of the reference; other types and
    ``out=`` are declined."""
    variant = _variant("ggml_linear/f32_rows_avx2")
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(EXPERTS, HIDDEN, generator=generator)
    rows = weight.view(torch.uint8)
    x = torch.randn(3, HIDDEN, generator=generator)
    assert variant.supports(x, rows, int(Q.F32)) is None
    torch.testing.assert_close(variant.impl(x, rows, int(Q.F32)), x @ weight.T, rtol=1e-5,
                               atol=1e-5)
    assert "F32" in variant.supports(x, rows, int(Q.Q4_K))
    assert "out=" in variant.supports(x, rows, int(Q.F32), out=torch.empty(3, EXPERTS))
    assert "F32 rows" in variant.supports(x, rows[:, :8], int(Q.F32))
