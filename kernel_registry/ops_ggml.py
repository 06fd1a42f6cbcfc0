"""The ops of GGUF (ggml) quantized weights, kept quantized: a linear layer and an embedding.

The weight is ``qweight``, ``uint8 [N, row_bytes]``: each row the tensor's GGUF blocks of
type ``ggml_type`` (a ``gguf.GGMLQuantizationType`` value) exactly as stored in the file;
:mod:`hwplug.kernel_registry.reference.ggml` documents the layouts and dequantizes them
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, and F32 / F16 /
BF16 as they are). The
type is a per-call argument: a variant's ``supports`` declines the types it does not serve.

``ggml_linear`` dispatches on the activation ``x``. Its tolerances allow a variant to
quantize the activations to int8 per block of 32 values (scale max|x| / 127, rounded to
nearest) before integer dot products, as llama.cpp does: each activation then moves by up
to half a step, max|x| / 254, which changes an output by about 0.55% of the outputs' rms
(the K rounding errors add up as a random walk); for the super-block types per 256 values
(llama.cpp's Q8_K: unit-normal activations' max over 256 is ~1.25 times that over 32, so
are the errors). For the inputs the conformance kit draws
(unit-rms activations and weights of rms ``K ** -0.5``, so outputs of unit rms) the C
kernel's worst error over 8192 outputs per type, K from 32 to 4096, was 0.035; atol 0.06
leaves room for heavier tails. The 1% rtol covers large outputs (whose error grows with
them); bf16 and fp16 outputs add their own rounding (2^-9, 2^-12 relative). The cpu
platform's C variant quantizes the 32-value types' activations to int16 by default (steps
of max|x| / 32767, 258 times finer: worst errors ~1e-4 at K = 4096; SmolLM2-135M Q4_1's
greedy 32 tokens then equal the dequantized fp32 model's on 20 of 20 prompts, 7 of 20 with
int8), to int8 where its tuning table says so, and the super-block types' to int8 per 256
as llama.cpp does; the tolerances stay int8's. Those tolerances are for variants that declare
their activation rounding (``Variant.activation_quantization``); one that computes with the
activations as given is held to ``exact_tolerances`` (fp32: 1e-3 absolute and relative, so
a 0.5% error in a scale or weight fails; fp16 4e-3; bf16, whose own rounding of the
weight and output is 2^-9 relative, 2e-2), as the conformance kit checks.
``ggml_embedding`` dispatches on the ids; dequantizing is exact arithmetic on the stored
scales, so a variant may differ from the reference only by fp32 rounding order.
"""

from __future__ import annotations

from hwplug.kernel_registry.registry import kernels

__all__ = ["ggml_embedding", "ggml_embedding_repacked", "ggml_linear", "ggml_linear_repacked",
           "ggml_repack"]

_REF = "hwplug.kernel_registry.reference.ggml:"
_REPACK = "hwplug.kernel_registry.reference.ggml_repack:"
#: ggml_linear's tolerances (activation rounding allowed) and exact ones.
_LINEAR = {"float32": (6e-2, 1e-2), "float16": (6e-2, 1.2e-2), "bfloat16": (6e-2, 2e-2)}
_EXACT = {"float32": (1e-3, 1e-3), "float16": (4e-3, 4e-3), "bfloat16": (2e-2, 2e-2)}

ggml_linear = kernels.define_op(
    "ggml_linear", _REF + "ggml_linear", tolerances=_LINEAR, exact_tolerances=_EXACT, doc="""
ggml_linear(x [..., K] float, qweight uint8 [N, row_bytes], ggml_type: int,
            bias [N] | None = None, out [..., N] | None = None)
    -> [..., N] = x @ dequantize(qweight, ggml_type).T + bias
    qweight: each row the GGUF blocks of one output row, as stored in the file
    (K / block_size blocks). Computed in fp32, returned in x.dtype. A variant may quantize
    x to int8 (or finer) per block of 32, per 256 for the super-block types (see the
    tolerances). Weights are read-only between calls. out: a tensor of x's dtype and the
    result's shape, e.g. a column slice of a wider output (any row stride), which receives
    the result and is returned: a layer whose rows come in runs of several types writes
    each run's columns of one output without concatenating.
""")

ggml_embedding = kernels.define_op(
    "ggml_embedding", _REF + "ggml_embedding",
    tolerances={"int64": (1e-6, 1e-6), "int32": (1e-6, 1e-6)}, doc="""
ggml_embedding(ids [T] int64 | int32, qweight uint8 [V, row_bytes], ggml_type: int)
    -> [T, K] float32 = dequantize(qweight[ids], ggml_type)
    Dequantizes only the rows it reads. An id outside [0, V) is an UnsupportedError.
""")

ggml_repack = kernels.define_op(
    "ggml_repack", _REPACK + "repack", tolerances={"uint8": (0.0, 0.0)}, doc="""
ggml_repack(qweight uint8 [N, row_bytes], ggml_type: int) -> uint8 [N, row_bytes]
    Q4_K or Q6_K rows in the layout ggml_linear_repacked multiplies: each group of 16 rows
    (the first N // 16 * 16), super-block by super-block, the rows' 32-bit words
    interleaved (Q6_K's trailing fp16 d after them); the rest of the rows as they are.
    The same bytes, reordered exactly (hwplug.kernel_registry.reference.ggml_repack).
    Another type is an UnsupportedError. Done once, when the weights are loaded.
""")

ggml_linear_repacked = kernels.define_op(
    "ggml_linear_repacked", _REPACK + "ggml_linear_repacked", tolerances=_LINEAR,
    exact_tolerances=_EXACT, doc="""
ggml_linear_repacked(x [..., K] float, packed uint8 [N, row_bytes], ggml_type: int,
                     bias [N] | None = None, out [..., N] | None = None)
    -> ggml_linear(x, rows, ggml_type, bias, out), packed = ggml_repack(rows, ggml_type)
    The same contract and tolerances as ggml_linear on weights ggml_repack wrote. The
    reference un-interleaves them first (slow: for checking); a model holds repacked
    weights only where a variant other than the reference serves this op.
""")

ggml_embedding_repacked = kernels.define_op(
    "ggml_embedding_repacked", _REPACK + "ggml_embedding_repacked",
    tolerances={"int64": (0.0, 0.0), "int32": (0.0, 0.0)}, doc="""
ggml_embedding_repacked(ids [T] int64 | int32, packed uint8 [V, row_bytes], ggml_type: int)
    -> ggml_embedding(ids, rows, ggml_type), packed = ggml_repack(rows, ggml_type)
    Row ids[t] read from the repacked layout (its lane of its group of 16, or as a row past
    the last whole group): a tied table held once, repacked for the LM head, serves the
    lookup too. Bitwise ggml_embedding's values. An id outside [0, V) is an UnsupportedError.
""")
