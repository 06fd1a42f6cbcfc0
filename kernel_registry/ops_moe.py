"""The mixture-of-experts ops: ``fused_moe``, and its two halves ``moe_topk`` (routing) and
``moe_experts`` (the experts' MLPs, weighted and summed) for platforms that fuse otherwise.

Expert weights are stacked (see :mod:`hwplug.kernel_registry.reference.moe`): ``w13 [E,
2I, H]``, each expert's gate rows then its up rows, and ``w2 [E, H, I]``. A variant must
choose exactly the reference's experts: routing weights are compared within fp32
rounding and expert ids exactly, so a wrong expert or a missed renormalisation fails.

Tolerances of the expert MLPs: two chained matmuls in fp32 whose summation order a
variant may change (blocked GEMMs, threads); for unit-rms inputs and weights of rms
``K ** -0.5`` the outputs are of unit rms and fp32 reorderings stay below 1e-5. bf16 and
fp16 inputs add their own rounding of the intermediate activations (2^-9, 2^-12
relative) where a variant keeps them in that dtype.
"""

from __future__ import annotations

from hwplug.kernel_registry.registry import kernels

__all__ = ["fused_moe", "ggml_moe_experts", "moe_experts", "moe_topk"]

_REF = "hwplug.kernel_registry.reference.moe:"
_EXPERTS = {"float32": (2e-4, 2e-4), "float16": (4e-3, 4e-3), "bfloat16": (3e-2, 3e-2)}

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
    tolerances={"float32": (1.2e-1, 2e-2), "float16": (1.2e-1, 2.4e-2),
                "bfloat16": (1.2e-1, 4e-2)},
    doc="""
ggml_moe_experts(x [T, H] float, w13 uint8 [E, 2I, row_bytes], w13_type: int,
                 w2 uint8 [E, H, row_bytes], w2_type: int, topk_weights [T, k] fp32,
                 topk_ids [T, k] int, activation="silu") -> [T, H] in x.dtype
    moe_experts over GGUF blocks kept quantized: each expert's rows of llama.cpp's stacked
    ffn_{gate,up}_exps (gate rows then up rows, one type) and ffn_down_exps tensors as the
    file stores them. A variant may quantize activations as ggml_linear does, before
    each of its two matmuls: the tolerances are twice ggml_linear's (the first matmul's
    error reaches the output through act(gate) * up and the down projection, both of
    about unit gain for unit-rms inputs and weights of rms K ** -0.5; the second adds its
    own). Measured: the cpu variant's worst error in bf16 was 0.062 over the kit's draws.
""")
