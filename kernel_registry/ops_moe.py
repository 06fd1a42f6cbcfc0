"""The mixture-of-experts ops: ``fused_moe``, and its two halves ``moe_topk`` (routing) and
``moe_experts`` (the experts' MLPs, weighted and summed) for platforms that fuse otherwise.

Expert weights are stacked (see :mod:`hwplug.kernel_registry.reference.moe`): ``w13 [E,
2I, H]``, each expert's gate rows then its up rows, and ``w2 [E, H, I]``. A variant must
choose exactly the reference's experts: routing weights are compared within fp32
rounding and expert ids exactly, so a wrong expert or a missed renormalisation fails.

Tolerances of the expert MLPs: two chained matmuls whose summation order a variant may
change (blocked GEMMs, threads), and whose intermediate activations (``act(gate) * up``)
and per-expert outputs a variant may keep in the input dtype, as the cpu platform's
does. For the kit's inputs (unit-rms x, weights of rms ``K ** -0.5``; routing weights
summing to up to 2.5 with scaling, up to 4 without renormalisation) that variant's
largest errors over two runs of 150 draws per dtype were 4e-6 in fp32, 0.125 in bf16 and
0.016 in fp16: a token's k contributions, each rounded to 8 (11) bits at its own
magnitude, can cancel into a small sum, so the absolute term carries most of the bf16
and fp16 tolerances. fp32's 2e-4 leaves room for TF32-class dot products.
"""

from __future__ import annotations

from hwplug.kernel_registry.registry import kernels

__all__ = ["fp8_moe_experts", "fused_moe", "ggml_moe_experts", "int8_moe_experts",
           "moe_experts", "moe_topk"]

_REF = "hwplug.kernel_registry.reference.moe:"
_QUANT_REF = "hwplug.kernel_registry.reference.moe_quant:"
_EXPERTS = {"float32": (2e-4, 2e-4), "float16": (8e-3, 8e-3), "bfloat16": (1e-1, 4e-2)}

moe_topk = kernels.define_op("moe_topk", _REF + "moe_topk",
                             tolerances={"float32": (1e-6, 1e-5), "float16": (1e-6, 1e-5),
                                         "bfloat16": (1e-6, 1e-5)}, doc="""
moe_topk(router_logits [T, E], top_k, renormalize=True, *, scoring="softmax",
         correction_bias [E] | None = None, num_expert_group=None, topk_group=None,
         routed_scaling_factor=1.0) -> (topk_weights [T, k] fp32, topk_ids [T, k] int64)
    scores = softmax(logits) or sigmoid(logits) (scoring); experts chosen by
    scores + correction_bias, in descending order; with grouped top-k only the topk_group
    best of num_expert_group equal groups are eligible (a group's score: its best choice
    score, or with a correction_bias the sum of its best two, as DeepSeek-V3). Weights:
    the chosen scores (without the bias), / their sum when renormalize (+1e-20 for
    sigmoid), * routed_scaling_factor. Logits in fp32 inside, whatever their dtype.
""")

moe_experts = kernels.define_op("moe_experts", _REF + "moe_experts", tolerances=_EXPERTS,
                                doc="""
moe_experts(x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights [T, k] fp32,
            topk_ids [T, k] int, activation="silu") -> [T, H] in x.dtype
    out[t] = sum_j topk_weights[t, j] * w2[e] @ act(gate) * up, where e = topk_ids[t, j]
    and gate, up = split(w13[e] @ x[t]) (activation silu or gelu, erf form). Ids lie in
    [0, E); experts that no token chose cost nothing. Weights are read-only between calls.
""")

fused_moe = kernels.define_op("fused_moe", _REF + "fused_moe", tolerances=_EXPERTS, doc="""
fused_moe(x [T, H], router_logits [T, E], w13 [E, 2I, H], w2 [E, H, I], top_k,
          renormalize=True, *, scoring, correction_bias, num_expert_group, topk_group,
          routed_scaling_factor, activation="silu", shared_w13 [2S, H] | None = None,
          shared_w2 [H, S] | None = None) -> [T, H] in x.dtype
    moe_experts(x, w13, w2, *moe_topk(router_logits, top_k, renormalize, ...), activation)
    plus the shared experts' MLP shared_w2 @ act(gate) * up, unweighted, when given.
""")

ggml_moe_experts = kernels.define_op(
    "ggml_moe_experts", _REF + "ggml_moe_experts",
    tolerances={"float32": (4e-1, 2e-2), "float16": (4e-1, 2.4e-2),
                "bfloat16": (4e-1, 4e-2)},
    doc="""
ggml_moe_experts(x [T, H] float, w13 uint8 [E, 2I, row_bytes], w13_type: int,
                 w2 uint8 [E, H, row_bytes], w2_type: int, topk_weights [T, k] fp32,
                 topk_ids [T, k] int, activation="silu") -> [T, H] in x.dtype
    moe_experts over GGUF blocks kept quantized: each expert's rows of llama.cpp's stacked
    ffn_{gate,up}_exps (gate rows then up rows, one type) and ffn_down_exps tensors as the
    file stores them. A variant may quantize activations as ggml_linear does, before
    each of its two matmuls. The errors compound: the first matmul's reaches the output
    through act(gate) * up (amplified by |silu(gate)| and |up|, up to ~3 for unit-rms
    inputs), and the intermediate, a product of two normal-like values, has heavy tails,
    so its int8 steps (max / 127 per 256) are coarse against its rms. Measured, the cpu
    variant's largest error over 140 kit draws (outputs of rms 0.6-0.9) was 0.20 (Q6_K,
    Q5_K among the worst); atol 0.4 is twice that. A wrong expert or a skipped slot
    moves outputs by about their rms, over the whole row.
""")

fp8_moe_experts = kernels.define_op(
    "fp8_moe_experts", _QUANT_REF + "fp8_moe_experts", tolerances=_EXPERTS, doc="""
fp8_moe_experts(x [T, H] float, w13 fp8_e4m3 [E, 2I, H], w13_scale fp32 [E, ceil(2I / br),
                ceil(H / bc)], w2 fp8_e4m3 [E, H, I], w2_scale fp32 [E, ceil(H / br),
                ceil(I / bc)], topk_weights [T, k] fp32, topk_ids [T, k] int,
                activation="silu", block_shape=(128, 128)) -> [T, H] in x.dtype
    moe_experts on the stacks dequantized tile by tile (w ~= values * scale per br x bc
    tile: DeepSeek-V3's weight_scale_inv); activations are not quantized. The tolerances
    are moe_experts': a variant that dequantizes the experts it runs to x's dtype adds
    that dtype's rounding of each weight, below its own arithmetic's. A scale applied to
    the wrong tile, or once per matrix, moves outputs by about their rms.
""")

int8_moe_experts = kernels.define_op(
    "int8_moe_experts", _QUANT_REF + "int8_moe_experts",
    tolerances={"float32": (2e-2, 1e-2), "float16": (3e-2, 2e-2), "bfloat16": (1.5e-1, 5e-2)},
    doc="""
int8_moe_experts(x [T, H] float, w13 int8 [E, 2I, H], w13_scale fp32 [E, 2I],
                 w2 int8 [E, H, I], w2_scale fp32 [E, H], topk_weights [T, k] fp32,
                 topk_ids [T, k] int, activation="silu") -> [T, H] in x.dtype
    moe_experts as W8A8: per-channel weight scales; each matmul's input quantized to int8
    per token (amax / 127, rounded, clamped), the integer products summed exactly, then
    both scales. A variant whose intermediate differs from the reference's in its last
    bits may round an element of act(gate) * up to the neighbouring int8 step (one step
    is amax / 127 of its row); the fp32 tolerance allows a few such steps per row.
""")
