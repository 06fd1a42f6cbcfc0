"""Input generators of the mixture-of-experts ops: ``moe_topk``, ``moe_experts``,
``fused_moe``, ``ggml_moe_experts``, ``fp8_moe_experts`` and ``int8_moe_experts`` (see :mod:`hwplug.conformance.inputs` for the
generator contract).

Routing draws softmax and sigmoid scoring, renormalisation on and off (on more often,
with top-k > 1, so a missed renormalisation shows), DeepSeek-V3's correction bias and
grouped top-k, and a routed scaling factor; router logits are spread widely enough that
no two experts tie. Expert inputs are of unit rms and weights of rms ``K ** -0.5`` (the
tolerances assume outputs of unit rms); expert ids cover a few experts more than the
tokens choose, so a kernel that reads the wrong expert, or skips one, is seen.

Quantized stacks draw their values and, independently, their scales: fp8 tiles of a
drawn block shape (128 x 128, or small tiles that leave partial ones at the edges) with
scales spread over a factor of 4 between tiles, int8 rows with per-channel scales spread
alike; so a scale read from the wrong tile or channel, or one scale for a whole matrix,
moves the outputs by about their rms.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from hwplug.conformance.case import Case, randn, seeded
from hwplug.dtypes import torch_dtype
from hwplug.kernel_registry.reference.ggml_weights import GGML_TYPES, ggml_block, ggml_weight
from hwplug.kernel_registry.reference.moe import moe_topk as reference_topk
from hwplug.kernel_registry.reference.moe_quant import block_scale_shape


def _routing(draw: st.DrawFn, rng: torch.Generator, experts: int
             ) -> tuple[int, bool, dict[str, Any], str]:
    """``(top_k, renormalize, options, label)`` of one routing."""
    scoring = draw(st.sampled_from(("softmax", "sigmoid")))
    grouped = experts % 2 == 0 and draw(st.booleans())
    top_k = draw(st.integers(2, experts // 2 if grouped else min(4, experts)))
    options: dict[str, Any] = {"scoring": scoring}
    if grouped:
        options.update(num_expert_group=2, topk_group=1)
    if scoring == "sigmoid" and draw(st.booleans()):
        options["correction_bias"] = torch.rand(experts, generator=rng) * 0.4 - 0.2
    if draw(st.booleans()):
        options["routed_scaling_factor"] = 2.5
    renormalize = draw(st.sampled_from((True, True, False)))
    label = (f"top-{top_k} of {experts} by {scoring}, renormalize={renormalize}"
             f"{', grouped 1 of 2' if grouped else ''}"
             f"{', correction bias' if 'correction_bias' in options else ''}"
             f"{', scaled 2.5' if 'routed_scaling_factor' in options else ''}")
    return top_k, renormalize, options, label


def _logits(rng: torch.Generator, tokens: int, experts: int, dtype: str) -> torch.Tensor:
    return randn(rng, (tokens, experts), dtype, scale=3.0)


def _experts(rng: torch.Generator, experts: int, hidden: int, intermediate: int, dtype: str
             ) -> tuple[torch.Tensor, torch.Tensor]:
    w13 = randn(rng, (experts, 2 * intermediate, hidden), "float32", scale=hidden ** -0.5)
    w2 = randn(rng, (experts, hidden, intermediate), "float32", scale=intermediate ** -0.5)
    return w13.to(torch_dtype(dtype)), w2.to(torch_dtype(dtype))


def _spread(rng: torch.Generator, shape: tuple[int, ...], base: float) -> torch.Tensor:
    """fp32 scales of ``shape``, ``base`` times factors log-uniform in [0.5, 2]."""
    return base * 2.0 ** (torch.rand(shape, generator=rng) * 2 - 1)


def _fp8_stack(rng: torch.Generator, shape: tuple[int, int, int], block: tuple[int, int]
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values of rms ~1 and block scales making the weights' rms ~``cols ** -0.5``."""
    values = torch.randn(shape, generator=rng).to(torch.float8_e4m3fn)
    scale = _spread(rng, block_scale_shape(values, block), shape[2] ** -0.5)
    return values, scale


def _int8_stack(rng: torch.Generator, shape: tuple[int, int, int]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values in [-127, 127] and per-channel scales, weights of rms ~``cols ** -0.5``."""
    values = torch.randint(-127, 128, shape, generator=rng, dtype=torch.int8)
    return values, _spread(rng, shape[:2], shape[2] ** -0.5 / 73.3)


def _quantized_case(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]
                    ) -> tuple[torch.Generator, torch.Tensor, tuple[int, int, int], tuple]:
    """``(rng, x [T, H], (E, H, I), (weights, ids))`` of a quantized experts call."""
    rng, (experts, hidden, intermediate) = seeded(draw), _sizes(draw)
    hidden, intermediate = hidden * 2, intermediate * 2  # a few tiles of each size
    top_k, renormalize, options, _ = _routing(draw, rng, experts)
    x = randn(rng, (draw(tokens), hidden), dtype)
    routing = reference_topk(_logits(rng, x.shape[0], experts, "float32"), top_k, renormalize,
                             **options)
    return rng, x, (experts, hidden, intermediate), routing


@st.composite
def fp8_moe_experts(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """fp8 stacks with block scales of a drawn tile (DeepSeek-V3's 128 x 128 or small)."""
    rng, x, (experts, hidden, intermediate), (weights, ids) = _quantized_case(draw, dtype,
                                                                             tokens)
    block = draw(st.sampled_from(((128, 128), (16, 16), (8, 32), (32, 8))))
    w13, w13_scale = _fp8_stack(rng, (experts, 2 * intermediate, hidden), block)
    w2, w2_scale = _fp8_stack(rng, (experts, hidden, intermediate), block)
    activation = draw(st.sampled_from(("silu", "gelu")))
    return Case((x, w13, w13_scale, w2, w2_scale, weights, ids, activation),
                {"block_shape": block}, (dtype,),
                f"x {tuple(x.shape)} {dtype}, {experts} fp8 experts [{2 * intermediate}, "
                f"{hidden}], tiles {block}, ids {ids.tolist()}, {activation}")


@st.composite
def int8_moe_experts(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """int8 stacks with per-channel scales (activations quantized by the op)."""
    rng, x, (experts, hidden, intermediate), (weights, ids) = _quantized_case(draw, dtype,
                                                                             tokens)
    w13, w13_scale = _int8_stack(rng, (experts, 2 * intermediate, hidden))
    w2, w2_scale = _int8_stack(rng, (experts, hidden, intermediate))
    activation = draw(st.sampled_from(("silu", "gelu")))
    return Case((x, w13, w13_scale, w2, w2_scale, weights, ids, activation), {}, (dtype,),
                f"x {tuple(x.shape)} {dtype}, {experts} int8 experts [{2 * intermediate}, "
                f"{hidden}], ids {ids.tolist()}, {activation}")


def _sizes(draw: st.DrawFn) -> tuple[int, int, int]:
    return (draw(st.sampled_from((4, 6, 8))), draw(st.sampled_from((16, 40, 64))),
            draw(st.sampled_from((8, 24, 32))))


@st.composite
def moe_topk(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng, experts = seeded(draw), draw(st.sampled_from((4, 6, 8, 16)))
    top_k, renormalize, options, label = _routing(draw, rng, experts)
    logits = _logits(rng, draw(tokens), experts, dtype)
    return Case((logits, top_k, renormalize), options, (dtype,),
                f"logits {tuple(logits.shape)} {dtype}, {label}")


def _experts_case(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]
                  ) -> tuple[torch.Generator, torch.Tensor, torch.Tensor, torch.Tensor, tuple]:
    """What the unquantized experts' generators draw first, in this order: ``(rng, x [T,
    H], w13 [E, 2I, H], w2 [E, H, I], _routing(...))``."""
    rng, (experts, hidden, intermediate) = seeded(draw), _sizes(draw)
    x = randn(rng, (draw(tokens), hidden), dtype)
    w13, w2 = _experts(rng, experts, hidden, intermediate, dtype)
    return rng, x, w13, w2, _routing(draw, rng, experts)


@st.composite
def moe_experts(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng, x, w13, w2, (top_k, renormalize, options, label) = _experts_case(draw, dtype, tokens)
    (num_tokens, hidden), (experts, intermediate) = x.shape, w2.shape[::2]
    weights, ids = reference_topk(_logits(rng, num_tokens, experts, "float32"), top_k,
                                  renormalize, **options)
    activation = draw(st.sampled_from(("silu", "gelu")))
    return Case((x, w13, w2, weights, ids, activation), {}, (dtype,),
                f"x {tuple(x.shape)} {dtype}, {experts} experts [{2 * intermediate}, "
                f"{hidden}], ids {ids.tolist()}, {activation}")


@st.composite
def fused_moe(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng, x, w13, w2, (top_k, renormalize, options, label) = _experts_case(draw, dtype, tokens)
    (num_tokens, hidden), (experts, intermediate) = x.shape, w2.shape[::2]
    options["activation"] = draw(st.sampled_from(("silu", "gelu")))
    if draw(st.booleans()):
        shared_w13, shared_w2 = _experts(rng, 1, hidden, intermediate, dtype)
        options.update(shared_w13=shared_w13[0], shared_w2=shared_w2[0])
        label += ", shared experts"
    logits = _logits(rng, num_tokens, experts, dtype)
    return Case((x, logits, w13, w2, top_k, renormalize), options, (dtype,),
                f"x {tuple(x.shape)} {dtype}, {experts} experts [{2 * intermediate}, "
                f"{hidden}], {label}, {options['activation']}")


@st.composite
def ggml_moe_experts(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """Stacked GGUF experts ``[E, rows, row_bytes]``, gate/up and down of drawn types."""
    rng, experts = seeded(draw), draw(st.sampled_from((3, 5)))
    up_type, down_type = draw(st.sampled_from(GGML_TYPES)), draw(st.sampled_from(GGML_TYPES))
    hidden = max(ggml_block(up_type), ggml_block(down_type))
    intermediate = hidden
    w13 = torch.stack([ggml_weight(rng, up_type, 2 * intermediate, hidden)
                       for _ in range(experts)])
    w2 = torch.stack([ggml_weight(rng, down_type, hidden, intermediate)
                      for _ in range(experts)])
    num_tokens = draw(tokens)
    weights, ids = reference_topk(_logits(rng, num_tokens, experts, "float32"), 2)
    x = randn(rng, (num_tokens, hidden), dtype)
    return Case((x, w13, up_type, w2, down_type, weights, ids), {}, (dtype,),
                f"x {tuple(x.shape)} {dtype}, {experts} experts of GGUF types {up_type} "
                f"(gate/up) and {down_type} (down), ids {ids.tolist()}")
