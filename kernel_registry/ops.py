"""The ops every platform provides. Each is declared once: contract, reference, tolerance.

Shapes: ``T`` tokens, ``B`` sequences, ``Hq``/``Hkv`` query/KV heads, ``D`` head size.
Tolerances are ``(atol, rtol)`` per dtype that every variant must meet against the
reference (the conformance kit checks them). Compute is fp32 inside; outputs take the
input dtype. All ops are functional except ``reshape_and_cache``, which writes in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hwplug.kernel_registry.registry import kernels

if TYPE_CHECKING:
    import torch

__all__ = ["build_cos_sin_cache", "embedding", "gelu_and_mul", "linear", "paged_attention",
           "reshape_and_cache", "rms_norm", "rotary_embedding", "scaled_mm", "silu_and_mul"]

_REF = "hwplug.kernel_registry.reference:"
_ELEMENTWISE = {"float32": (1e-5, 1e-5), "float16": (1e-3, 1e-3), "bfloat16": (1.6e-2, 1.6e-2)}
#: An fp8 value stored by two variants may differ by one code (a different rounding of
#: x / scale): 1 ulp is 2^-3 relative for e4m3, 2^-2 for e5m2.
_FP8_STORED = {"fp8_e4m3": (2e-3, 0.125), "fp8_e5m2": (2e-3, 0.25),
               "fp8_e4m3fnuz": (2e-3, 0.125)}
#: Attention accumulates over the context; fp32 allows TF32-class dot products.
_ATTENTION = {"float32": (2e-3, 2e-3), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2)}

rms_norm = kernels.define_op("rms_norm", _REF + "rms_norm", tolerances=_ELEMENTWISE, doc="""
rms_norm(x [..., H], weight [H], eps, residual=None)
    Without residual: x * rsqrt(mean(x**2, -1) + eps) * weight.
    With residual: s = x + residual; returns (rms_norm(s), s).
""")

rotary_embedding = kernels.define_op(
    "rotary_embedding", _REF + "rotary_embedding", tolerances=_ELEMENTWISE, dispatch_arg=1,
    doc="""
rotary_embedding(positions [T] int64, query [T, Hq, D], key [T, Hkv, D],
                 cos_sin_cache [max_pos, rot_dim] fp32, is_neox) -> (query, key)
    Rotates the first rot_dim dims of each head by the angle of its position; cos in the
    first rot_dim/2 columns of the cache, sin in the rest. neox pairs (i, i + rot_dim/2),
    gptj pairs (2i, 2i + 1). Build the cache with ops.build_cos_sin_cache.
""")

silu_and_mul = kernels.define_op("silu_and_mul", _REF + "silu_and_mul",
                                 tolerances=_ELEMENTWISE, doc="""
silu_and_mul(x [..., 2d]) -> [..., d] = silu(x[..., :d]) * x[..., d:]
""")

gelu_and_mul = kernels.define_op("gelu_and_mul", _REF + "gelu_and_mul",
                                 tolerances=_ELEMENTWISE, doc="""
gelu_and_mul(x [..., 2d], approximate="none") -> [..., d] = gelu(x[..., :d]) * x[..., d:]
""")

reshape_and_cache = kernels.define_op("reshape_and_cache", _REF + "reshape_and_cache",
                                      tolerances={**_ELEMENTWISE, **_FP8_STORED},
                                      layout_arg=4, doc="""
reshape_and_cache(key [T, Hkv, D], value [T, Hkv, D], kv_cache, slot_mapping [T] int64,
                  params: PagedAttentionParams)
    In place, into kv_cache in layout params.layout (a variant serves the layouts it
    declares; the reference any, through NHD). In NHD, [2, num_blocks, block_size, Hkv, D]:
    key[t] -> kv_cache[0, slot // block_size, slot % block_size], value[t] ->
    kv_cache[1, ...], cast to the cache dtype. A negative slot is skipped.
    params.k_scale / params.v_scale (float32, [] per tensor or [Hkv] per KV head; given for
    fp8 caches) divide what is stored: stored = (key / k_scale).to(cache dtype), fp8
    saturating.
""")

paged_attention = kernels.define_op("paged_attention", _REF + "paged_attention",
                                    tolerances=_ATTENTION, layout_arg=3, doc="""
paged_attention(query [T, Hq, D], kv_cache, metadata: AttentionMetadata,
                params: PagedAttentionParams) -> [T, Hq, D]
    kv_cache in layout params.layout (NHD: [2, num_blocks, block_size, Hkv, D]); a variant
    serves the layouts it declares, the reference any (through NHD). metadata: the step's block_tables [B, max_blocks] int32, seq_lens [B] int32,
    query_start_loc [B+1] int32 and host-side max_query_len / max_seq_len (its
    slot_mapping is not read); params: the layer's scale, causal, sliding_window, soft_cap,
    k_scale, v_scale. Sequence i's queries query[qsl[i]:qsl[i+1]] are the last tokens of its
    context of seq_lens[i] tokens (already cached). Key k is visible to the query at
    position p iff (not causal or k <= p) and (sliding_window is None or
    p - k < sliding_window). logits = scale * q.k, soft-capped as
    soft_cap * tanh(logits / soft_cap) if set; softmax in fp32; GQA: query head h reads KV
    head h // (Hq // Hkv). Covers prefill, chunked prefill and decode, mixed in one batch.
    Cached K / V read as stored.float() * k_scale / * v_scale when the scales are given
    (see reshape_and_cache).
""")

linear = kernels.define_op("linear", _REF + "linear",
                           tolerances={"float32": (1e-4, 1e-4), "bfloat16": (2e-2, 2e-2),
                                       "float16": (2e-3, 2e-3)}, doc="""
linear(x [..., K], weight [N, K], bias [N] | None = None) -> [..., N] = x @ weight.T + bias
    Weights are read-only between calls: a variant may keep a repacked copy of a weight,
    rebuilt when the tensor's version counter shows it was written.
""")

embedding = kernels.define_op("embedding", _REF + "embedding",
                              tolerances={"int64": (0.0, 0.0), "int32": (0.0, 0.0)}, doc="""
embedding(ids [T] int64 | int32, weight [V, H]) -> [T, H] = weight[ids], in weight's dtype
    A lookup of an unquantized table (GGUF blocks: ggml_embedding): rows are copied
    exactly. ids lie in [0, V) (the engine checks token ids where prompts enter; no
    device sync here to check them again); hwplug's CPU variant raises UnsupportedError
    for one outside.
""")

scaled_mm = kernels.define_op("scaled_mm", _REF + "scaled_mm",
                              tolerances={"fp8_e4m3": (2e-2, 2e-2), "fp8_e5m2": (5e-2, 5e-2),
                                          "fp8_e4m3fnuz": (2e-2, 2e-2),
                                          "int8": (1e-3, 1e-4), "float32": (1e-4, 1e-4),
                                          "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)},
                              doc="""
scaled_mm(a [M, K], b [K, N], scale_a, scale_b, out_dtype, bias [N] | None = None) -> [M, N]
    ((a.float() * scale_a) @ (b.float() * scale_b) + bias).to(out_dtype): the GEMM of every
    quantized linear layer. a and b: fp8, int8, or a float activation with int8 weights.
    scale_a fp32: scalar, [M, 1] per token, or [M, K/g] per token group of g inputs;
    scale_b fp32: scalar, [1, N] per channel, or [K/bk, N/bn] per bk x bn block (group
    and block sizes divide K and N; see reference.matmul.expand_scale).
""")


def build_cos_sin_cache(rot_dim: int, max_position: int, base: float,
                        rope_scaling: Mapping[str, Any] | None = None) -> torch.Tensor:
    """The ``cos_sin_cache`` ``rotary_embedding`` reads (see
    :func:`hwplug.kernel_registry.reference.rotary.build_cos_sin_cache`)."""
    from hwplug.kernel_registry.reference import rotary

    return rotary.build_cos_sin_cache(rot_dim, max_position, base, rope_scaling)
