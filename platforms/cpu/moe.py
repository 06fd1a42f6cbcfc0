"""The CPU platform's mixture-of-experts variants: tokens grouped by expert.

:func:`grouped_experts` sorts the ``T * k`` (token, slot) pairs by expert once, gathers
each expert's tokens into one contiguous run, and runs each *active* expert's MLP once
over its run (experts no token chose are skipped; a decode step with top-8 runs 8 MLPs
of one row each, whatever the expert count). The matmuls go through the registry's
``linear`` op (the C GEMV/GEMM for fp32); the weighted rows are summed back per token with
one ``index_add_``. GGUF experts have variants of their own (:mod:`.ggml_moe`).

Quantized stacks stay quantized in memory. fp8 block-scaled experts: each active
expert's two matrices are dequantized, tile by tile, to fp32 when it runs (CPUs have no
fp8 GEMM; a decode step dequantizes top-k experts, not all of them), then go through the
fp32 ``linear`` (the C GEMV/GEMM: a bf16 weight made per call would be repacked by oneDNN
at every call). torch's fp8 -> float cast is scalar on CPUs (~10 ns a value);
:func:`dequantize_fp8` moves each e4m3 value's bits into a bf16 (integer shifts, exact). int8 W8A8 experts: each run's rows are quantized per token and
multiplied by ``scaled_mm`` (``torch._int_mm`` where the CPU has VNNI).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hwplug.kernel_registry import ops
from hwplug.kernel_registry.moe_compose import fused_supported, gated
from hwplug.kernel_registry.reference.moe import check_experts
from hwplug.kernel_registry.reference.moe_quant import (
    BLOCK_SHAPE,
    check_fp8,
    check_int8,
    dequantize_blocks,
    quantize_tokens,
)

#: One expert's projection: ``(rows [n, in], expert) -> [n, out]``.
Project = Callable[[torch.Tensor, int], torch.Tensor]
#: An e4m3 byte (sign, 4 exponent, 3 mantissa bits) shifted left by 4, masked with this
#: (0x87F0 as int16), is the bf16 of the same sign and mantissa with the exponent biased
#: by 0 instead of 7: the e4m3 value times 2**-120, subnormals included.
_E4M3_AS_BF16 = -0x7810
_E4M3_BIAS = 2.0 ** 120


def grouped_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                    num_experts: int, up: Project, down: Project, activation: str
                    ) -> torch.Tensor:
    """``moe_experts`` over projections ``up`` (gate and up rows) and ``down``, run once
    per active expert on its tokens; returns ``[T, H]`` in ``x.dtype``."""
    num_tokens, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    rows = x.index_select(0, order // k)
    act = gated(activation)
    out_rows = torch.empty(rows.shape, dtype=torch.float32)
    starts, sizes = (counts.cumsum(0) - counts).tolist(), counts.tolist()
    for expert in counts.nonzero().flatten().tolist():
        start, count = starts[expert], sizes[expert]
        out_rows[start:start + count] = down(act(up(rows[start:start + count], expert)),
                                             expert)
    out_rows *= topk_weights.reshape(-1)[order].unsqueeze(1).float()
    out = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32)
    out.index_add_(0, order // k, out_rows)
    return out.to(x.dtype)


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """The ``moe_experts`` op: :func:`grouped_experts` over the ``linear`` op."""
    check_experts(x, w13, w2, topk_weights, topk_ids, activation)
    return grouped_experts(x, topk_weights, topk_ids, w13.shape[0],
                           lambda rows, e: ops.linear(rows, w13[e]),
                           lambda rows, e: ops.linear(rows, w2[e]), activation)


def experts_supported(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, *args: Any,
                      **kwargs: Any) -> str | None:
    """Why :func:`moe_experts` declines a call, or None: weights in ``x``'s dtype."""
    return fused_supported(x, x, w13, w2)


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor, block_shape: tuple[int, int],
                   dtype: torch.dtype) -> torch.Tensor:
    """``dequantize_blocks(values, scale, block_shape)`` in ``dtype`` for one e4m3fn matrix
    ``[rows, cols]``: exact in fp32 (NaN codes aside, which checkpoints do not hold)."""
    (rows, cols), (br, bc) = values.shape, block_shape
    if rows % br or cols % bc:  # partial edge tiles
        return dequantize_blocks(values, scale, block_shape).to(dtype)
    bits = values.view(torch.int8).to(torch.int16)
    bits <<= 4
    bits &= _E4M3_AS_BF16
    tiles = bits.view(torch.bfloat16).view(rows // br, br, cols // bc, bc).float()
    tiles *= (scale.float() * _E4M3_BIAS)[:, None, :, None]
    return tiles.view(rows, cols).to(dtype)


def fp8_moe_experts(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                    w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, activation: str = "silu",
                    block_shape: tuple[int, int] = BLOCK_SHAPE) -> torch.Tensor:
    """The ``fp8_moe_experts`` op: :func:`grouped_experts`, each active expert dequantized
    to fp32 when it runs, its rows in fp32 through the ``linear`` op."""
    block_shape = tuple(block_shape)
    check_fp8(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation,
              block_shape)

    def project(w: torch.Tensor, scale: torch.Tensor) -> Project:
        return lambda rows, e: ops.linear(rows.float(), dequantize_fp8(
            w[e], scale[e], block_shape, torch.float32))

    return grouped_experts(x, topk_weights, topk_ids, w13.shape[0], project(w13, w13_scale),
                           project(w2, w2_scale), activation)


def int8_moe_experts(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                     w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The ``int8_moe_experts`` op: :func:`grouped_experts`, each run quantized per token
    and multiplied by the ``scaled_mm`` op on the int8 expert (fp32 out)."""
    check_int8(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation)

    def project(w: torch.Tensor, scale: torch.Tensor) -> Project:
        def run(rows: torch.Tensor, e: int) -> torch.Tensor:
            values, row_scale = quantize_tokens(rows)
            return ops.scaled_mm(values, w[e].t(), row_scale, scale[e].view(1, -1),
                                 torch.float32)
        return run

    return grouped_experts(x, topk_weights, topk_ids, w13.shape[0], project(w13, w13_scale),
                           project(w2, w2_scale), activation)
