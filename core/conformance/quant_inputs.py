"""Input generators of the quantized ops: ``scaled_mm``, ``ggml_linear``/``ggml_embedding``,
``ggml_repack``/``ggml_linear_repacked``/``ggml_embedding_repacked`` and ``int4_linear`` (see :mod:`hwplug.conformance.inputs` for the generator contract)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hypothesis import strategies as st

from hwplug.conformance.case import Case, leading_shape, randn, seeded
from hwplug.dtypes import FLOAT_DTYPES, torch_dtype
from hwplug.kernel_registry.reference.ggml_repack import REPACKED_TYPES, repack
from hwplug.kernel_registry.reference.ggml_weights import GGML_TYPES, ggml_block, ggml_weight


@st.composite
def scaled_mm(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """A quantized GEMM: ``a`` in ``dtype``; ``b`` (a weight, transposed) in ``dtype`` or,
    for a float ``a``, int8 (weight-only, ``scale_a`` 1); scales per tensor, token /
    channel, or token group / block."""
    rng = seeded(draw)
    m, k, n = draw(tokens), draw(st.sampled_from((32, 64, 96))), draw(st.sampled_from((16, 48)))
    weight_only = dtype in FLOAT_DTYPES and draw(st.booleans())
    a = randn(rng, (m, k), dtype) if dtype != "int8" else randint8(rng, (m, k))
    # b is a linear layer's weight [n, k] transposed, as the quant methods pass it
    b = (randint8(rng, (n, k)) if weight_only or dtype == "int8"
         else randn(rng, (n, k), dtype)).t()
    kind_a = "one" if weight_only else draw(st.sampled_from(("tensor", "token", "group")))
    kind_b = draw(st.sampled_from(("tensor", "channel", "block")))
    group, block = draw(st.sampled_from((16, 32))), draw(st.sampled_from(((16, 16), (32, 16))))
    scale_a = {"one": torch.ones(()), "tensor": torch.rand((), generator=rng) + 0.5,
               "token": torch.rand((m, 1), generator=rng) + 0.5,
               "group": torch.rand((m, k // group), generator=rng) + 0.5}[kind_a]
    scale_b = {"tensor": torch.rand((), generator=rng) + 0.5,
               "channel": torch.rand((1, n), generator=rng) + 0.5,
               "block": torch.rand((k // block[0], n // block[1]), generator=rng) + 0.5
               }[kind_b]
    out_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    bias = randn(rng, (n,), out_dtype) if draw(st.booleans()) else None
    label = (f"a ({m}, {k}) {dtype} b ({k}, {n}) {str(b.dtype).removeprefix('torch.')} -> "
             f"{out_dtype}, scale_a {kind_a} {list(scale_a.shape)}, scale_b {kind_b} "
             f"{list(scale_b.shape)}, bias={bias is not None}")
    return Case((a, b, scale_a, scale_b, torch_dtype(out_dtype)), {"bias": bias},
                (dtype, out_dtype), label)


def randint8(rng: torch.Generator, shape: Sequence[int]) -> torch.Tensor:
    """Uniform int8 values in [-127, 127] (symmetric, as int8 quantization makes them)."""
    return torch.randint(-127, 128, tuple(shape), generator=rng, dtype=torch.int8)


@st.composite
def ggml(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """Random GGUF rows of a quantized type and, as the dispatch tensor's ``dtype`` says,
    ``ggml_linear``'s x (a float dtype) or ``ggml_embedding``'s ids (int64, int32)."""
    rng, kind, n = seeded(draw), draw(st.sampled_from(GGML_TYPES)), draw(st.integers(1, 24))
    k = draw(st.sampled_from((32, 96, 160) if ggml_block(kind) == 32 else (256, 512)))
    weight, what = ggml_weight(rng, kind, n, k), f"{n} rows of {k} of GGUF type {kind}"
    if dtype.startswith("int"):
        ids = torch.randint(0, n, (draw(tokens),), generator=rng).to(getattr(torch, dtype))
        return Case((ids, weight, kind), {}, (dtype,), f"{dtype} ids {ids.tolist()} into {what}")
    x, bias = randn(rng, (*leading_shape(draw, tokens), k), dtype), randn(rng, (n,), dtype)
    bias = bias if draw(st.booleans()) else None
    return Case((x, weight, kind), {"bias": bias}, (dtype,),
                f"x {tuple(x.shape)} {dtype} by {what}, bias={bias is not None}")


@st.composite
def ggml_repacked(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """Random Q4_K / Q5_K / Q6_K / IQ4_XS rows: ``ggml_repack``'s (``dtype`` uint8, ``tokens`` rows), or,
    repacked (groups of 16 and the rows after them), ``ggml_linear_repacked``'s with x of a
    float ``dtype`` or ``ggml_embedding_repacked``'s with ids (int64, int32)."""
    rng, kind = seeded(draw), draw(st.sampled_from(sorted(REPACKED_TYPES)))
    k = draw(st.sampled_from((256, 512)))
    if dtype == "uint8":
        n = draw(tokens)
        return Case((ggml_weight(rng, kind, n, k), kind), {}, (dtype,),
                    f"{n} rows of {k} of GGUF type {kind}")
    n = draw(st.integers(1, 40))
    packed = repack(ggml_weight(rng, kind, n, k), kind)
    if dtype.startswith("int"):
        ids = torch.randint(0, n, (draw(tokens),), generator=rng).to(getattr(torch, dtype))
        return Case((ids, packed, kind), {}, (dtype,),
                    f"{dtype} ids {ids.tolist()} into {n} repacked rows of {k} of type {kind}")
    x, bias = randn(rng, (*leading_shape(draw, tokens), k), dtype), randn(rng, (n,), dtype)
    bias = bias if draw(st.booleans()) else None
    return Case((x, packed, kind), {"bias": bias}, (dtype,),
                f"x {tuple(x.shape)} {dtype} by {n} repacked rows of {k} of GGUF type {kind}, "
                f"bias={bias is not None}")


def random_int4(rng: torch.Generator, out_features: int, in_features: int,
                group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(qweight, scales)`` in the ``int4_linear`` op's layout: every byte value (so every
    code -8..7) and positive scales of ``[N, K / group]``, sized so the weight's rows have
    unit norm (rms ``K ** -0.5``): a unit-rms activation gives unit-rms outputs."""
    qweight = torch.randint(0, 256, (out_features, in_features // 2), generator=rng,
                            dtype=torch.uint8)
    code_rms = (torch.arange(-8, 8).float() ** 2).mean().sqrt()  # 4.6
    scales = torch.rand(out_features, in_features // group, generator=rng) + 0.5
    return qweight, scales * (in_features ** -0.5 / code_rms / 1.04)  # E[u^2] of u ~ U(.5, 1.5)


@st.composite
def int4_linear(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """Every int4 code, groups of 16 or 32 inputs or whole rows, unit-rms activations and
    outputs (the op's tolerances assume them), bias or not."""
    rng, leading = seeded(draw), leading_shape(draw, tokens)
    k, n = draw(st.sampled_from((64, 96, 192))), draw(st.sampled_from((8, 24, 40)))
    group = draw(st.sampled_from((16, 32, k)))
    qweight, scales = random_int4(rng, n, k, group)
    x = randn(rng, (*leading, k), dtype)
    bias = randn(rng, (n,), dtype) if draw(st.booleans()) else None
    label = (f"x {(*leading, k)} {dtype}, int4 weight ({n}, {k}) in groups of {group}, "
             f"bias={bias is not None}")
    return Case((x, qweight, scales), {"bias": bias}, (dtype,), label)
