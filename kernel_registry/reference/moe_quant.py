"""Mixture-of-experts references over quantized expert stacks: fp8 with block scales
(DeepSeek-V3's own format) and int8 W8A8 (compressed-tensors' per-channel weights with
dynamic per-token activations).

Stacks are laid out as :mod:`.moe`'s (``w13 [E, 2I, H]``, gate rows then up rows, and
``w2 [E, H, I]``), their values in ``float8_e4m3fn`` or ``int8``, with fp32 scales that
multiply: ``w ~= values * scale``.

- fp8: ``scale [E, ceil(rows / br), ceil(cols / bc)]``, one per ``br x bc`` tile of each
  expert's matrix (``block_shape``, DeepSeek-V3's ``[128, 128]``; the checkpoint calls it
  ``weight_scale_inv``). The chosen experts are dequantized tile by tile and run as
  unquantized experts: activations stay in fp32.
- int8: ``scale [E, rows]``, one per output channel. Each matmul's input rows are
  quantized to int8 per token (``amax / 127``, round half to even, clamped to [-128, 127]),
  multiplied exactly (in float64) and scaled back: the intermediate ``act(gate) * up`` is
  quantized again before the down projection, as W8A8 linear layers do.
"""

from __future__ import annotations

import math

import torch

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.moe import check_experts, expert_sum, moe_experts

#: DeepSeek-V3's fp8 tile: 128 output rows x 128 input columns.
BLOCK_SHAPE = (128, 128)
#: Smallest per-token activation scale, so an all-zero row quantizes to zeros.
MIN_SCALE = 1e-12


def dequantize_blocks(values: torch.Tensor, scale: torch.Tensor,
                      block_shape: tuple[int, int] = BLOCK_SHAPE) -> torch.Tensor:
    """``values [..., rows, cols]`` times their tile's ``scale [..., ceil(rows / br),
    ceil(cols / bc)]``, in fp32 (the last tiles of a side may be partial)."""
    rows, cols = values.shape[-2:]
    br, bc = block_shape
    full = scale.float().repeat_interleave(br, -2).repeat_interleave(bc, -1)
    return values.float() * full[..., :rows, :cols]


def check_scales(w: torch.Tensor, scale: torch.Tensor, want: tuple[int, ...], what: str
                 ) -> None:
    """Raise :class:`UnsupportedError` unless ``scale`` is fp32 of shape ``want``."""
    if tuple(scale.shape) != want or scale.dtype != torch.float32:
        raise UnsupportedError(f"{what} scales must be float32 {list(want)} for weights "
                               f"{list(w.shape)}, got {scale.dtype} {list(scale.shape)}")


def block_scale_shape(w: torch.Tensor, block_shape: tuple[int, int]) -> tuple[int, int, int]:
    """The ``[E, ceil(rows / br), ceil(cols / bc)]`` block scales of stack ``w``."""
    experts, rows, cols = w.shape
    return experts, math.ceil(rows / block_shape[0]), math.ceil(cols / block_shape[1])


def check_fp8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
              w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              activation: str, block_shape: tuple[int, int]) -> None:
    """Raise :class:`UnsupportedError` naming what is wrong with an fp8 experts call."""
    check_experts(x, w13, w2, topk_weights, topk_ids, activation)
    if w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn:
        raise UnsupportedError(f"fp8 experts must be float8_e4m3fn, got {w13.dtype} and "
                               f"{w2.dtype}")
    if len(block_shape) != 2 or min(block_shape) < 1:
        raise UnsupportedError(f"block_shape must be two positive sizes, got {block_shape}")
    check_scales(w13, w13_scale, block_scale_shape(w13, block_shape), "w13")
    check_scales(w2, w2_scale, block_scale_shape(w2, block_shape), "w2")


def fp8_moe_experts(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                    w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, activation: str = "silu",
                    block_shape: tuple[int, int] = BLOCK_SHAPE) -> torch.Tensor:
    """:func:`~.moe.moe_experts` over fp8 stacks with block scales: the chosen experts
    dequantized tile by tile (:func:`dequantize_blocks`), then the unquantized reference."""
    block_shape = tuple(block_shape)
    check_fp8(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation,
              block_shape)
    used, local = topk_ids.unique(return_inverse=True)
    up = dequantize_blocks(w13[used], w13_scale[used], block_shape)
    down = dequantize_blocks(w2[used], w2_scale[used], block_shape)
    return moe_experts(x, up, down, topk_weights, local, activation)


def check_int8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
               w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               activation: str) -> None:
    """Raise :class:`UnsupportedError` naming what is wrong with an int8 experts call."""
    check_experts(x, w13, w2, topk_weights, topk_ids, activation)
    if w13.dtype != torch.int8 or w2.dtype != torch.int8:
        raise UnsupportedError(f"int8 experts must be int8, got {w13.dtype} and {w2.dtype}")
    check_scales(w13, w13_scale, tuple(w13.shape[:2]), "w13")
    check_scales(w2, w2_scale, tuple(w2.shape[:2]), "w2")


def quantize_tokens(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows [n, K]`` -> ``(int8 [n, K], fp32 scale [n, 1])``, ``rows ~= values *
    scale`` per token (see the module docstring)."""
    rows = rows.float()
    scale = (rows.abs().amax(-1, keepdim=True) / 127).clamp(min=MIN_SCALE)
    return (rows / scale).round().clamp(-128, 127).to(torch.int8), scale


def int8_project(rows: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``rows [n, K]`` quantized per token, times int8 ``w [N, K]`` with per-channel
    ``scale [N]``: ``[n, N]`` fp32 (integer products summed exactly in float64)."""
    values, row_scale = quantize_tokens(rows)
    dots = (values.double() @ w.double().T).float()
    return dots * row_scale * scale.float()


def int8_moe_experts(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                     w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """:func:`~.moe.moe_experts` over int8 stacks with per-channel ``w13_scale [E, 2I]`` and
    ``w2_scale [E, H]``, each matmul on int8 activations per token (:func:`int8_project`)."""
    check_int8(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, activation)
    out = expert_sum(x, topk_weights, topk_ids,
                     lambda rows, e: int8_project(rows, w13[e], w13_scale[e]),
                     lambda rows, e: int8_project(rows, w2[e], w2_scale[e]), activation)
    return out.to(x.dtype)
