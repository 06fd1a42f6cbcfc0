"""The op of group-wise symmetric int4 weights: ``int4_linear``, a W4A16 linear layer.

The weight stays packed, two 4-bit values per byte, with one scale per output row and
group of inputs; :mod:`hwplug.kernel_registry.reference.int4` states the layout exactly
(it is the one ``torch.ops.aten._dyn_quant_pack_4bit_weight`` takes) and holds the
reference: dequantize, then ``F.linear`` in float32. The op dispatches on the activation
``x``; hwplug-cpu-arm's ``kleidiai`` variants serve it through KleidiAI on Arm cores
with dotprod.

Tolerances. A variant may quantize each row of ``x`` to int8 before integer dot products,
as KleidiAI does (asymmetric over the row's [min, max], with 0 exact: a step of
``(max - min) / 255``), and may round group scales to bfloat16 (KleidiAI's group-wise
kernels take them so: a relative change of at most 2^-9 per scale). Each activation then
moves by up to half a step; for unit-rms activations of a few hundred inputs (a range of
about 6) that is an error of rms ~0.006 per input, which a weight row of unit norm turns
into an output error of rms ~0.006. For unit-rms outputs (weights of rms ``K ** -0.5``,
as the conformance kit draws them) torch's ``_dyn_quant_matmul_4bit`` was measured at
most 0.038 off the reference in fp32 (20 weights x 16 x 64 outputs for each K of 64,
192, 576, 1536, per group of 32 and per row), 0.047 with bf16 activations: atol 0.06.
The 1% rtol covers large outputs and the bf16 scales; bf16 and fp16 outputs add their
own rounding (2^-9, 2^-12). Those tolerances are for variants that declare their
activation rounding (``Variant.activation_quantization``, as KleidiAI's do); one that
computes with the activations as given (the reference) is held to ``exact_tolerances``
(fp32: 1e-3 absolute and relative, so a 0.5% error in a scale fails).
"""

from __future__ import annotations

from hwplug.kernel_registry.registry import kernels

__all__ = ["int4_linear"]

int4_linear = kernels.define_op(
    "int4_linear", "hwplug.kernel_registry.reference.int4:int4_linear",
    tolerances={"float32": (6e-2, 1e-2), "float16": (6e-2, 1.2e-2), "bfloat16": (6e-2, 2e-2)},
    exact_tolerances={"float32": (1e-3, 1e-3), "float16": (4e-3, 4e-3),
                      "bfloat16": (2e-2, 2e-2)},
    doc="""
int4_linear(x [..., K] float, qweight uint8 [N, K / 2], scales float32 [N, K / g],
            bias [N] | None = None) -> [..., N] = x @ W.T + bias, in x.dtype
    W[n, k] = (((qweight[n, k // 2] >> 4 * (k % 2)) & 0xF) - 8) * scales[n, k // g]:
    symmetric int4, even k in the low nibble, with an offset of 8 (see
    reference.int4); g (the group size) = K / scales.shape[1], g = K for one scale per
    row. A variant may quantize x per row to int8 and round scales to bf16 (see the
    tolerances). Weights are read-only between calls: a variant may keep a repacked copy,
    rebuilt when the tensors' version counters show they were written.
""")
