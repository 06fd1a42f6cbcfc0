"""``rotary_embedding`` (RoPE) for query and key in one Triton launch, one program per token.

Contract (the ``rotary_embedding`` op): ``positions [T]`` int, ``query [T, Hq, D]``,
``key [T, Hk, D]``, ``cos_sin_cache [max_pos, rot_dim]`` (cos in the first ``rot_dim/2``
columns, sin in the rest). The first ``rot_dim`` dims of every head rotate, pairs
``(i, i + rot_dim/2)`` when ``is_neox`` else ``(2i, 2i + 1)``; the rest pass through.
fp32 inside; returns new contiguous ``(query, key)`` in their input dtypes.

supports: any float dtypes, even ``rot_dim <= D``, a cache with unit column stride; heads
without a unit-stride last dimension are copied first. See :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.tuning import launch_config


def supported(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              cos_sin_cache: torch.Tensor, is_neox: bool) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    rot_dim, head_size = cos_sin_cache.shape[-1], query.shape[-1]
    if query.dim() != 3 or key.dim() != 3 or key.shape[-1] != head_size:
        return f"expected query [T, Hq, D] and key [T, Hk, D], got {tuple(query.shape)} " \
               f"and {tuple(key.shape)}"
    if rot_dim % 2 or rot_dim > head_size:
        return f"rot_dim {rot_dim} must be even and <= head size {head_size}"
    if positions.shape != (query.shape[0],) or key.shape[0] != query.shape[0]:
        return f"positions {tuple(positions.shape)} must be [T] with T = {query.shape[0]}"
    if cos_sin_cache.stride(-1) != 1:
        return "cos_sin_cache needs a unit stride in its last dimension"
    return None


@checked(supported)
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rotary_embedding`` op (see the module docstring)."""
    query, key = _unit_stride(query), _unit_stride(key)
    query_out, key_out = query.new_empty(query.shape), key.new_empty(key.shape)
    num_tokens, _, head_size = query.shape
    if num_tokens == 0:
        return query_out, key_out
    rot_dim = cos_sin_cache.shape[-1]
    config = launch_config("rotary_embedding", query.device, head_size)
    block_half = triton.next_power_of_2(rot_dim // 2)
    _rotary_kernel[(num_tokens,)](
        positions, cos_sin_cache, cos_sin_cache.stride(0),
        query, query_out, query.stride(0), query.stride(1), query.shape[1],
        key, key_out, key.stride(0), key.stride(1), key.shape[1],
        HEAD_SIZE=head_size, ROT_DIM=rot_dim, IS_NEOX=is_neox,
        BLOCK_HEADS=max(1, config["tile"] // block_half), BLOCK_HALF=block_half,
        BLOCK_PASS=triton.next_power_of_2(max(1, head_size - rot_dim)),
        num_warps=config["num_warps"])
    return query_out, key_out


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


@triton.jit
def _rotary_kernel(positions_ptr, cache_ptr, cache_stride,
                   q_ptr, q_out_ptr, q_stride_t, q_stride_h, num_q_heads,
                   k_ptr, k_out_ptr, k_stride_t, k_stride_h, num_k_heads,
                   HEAD_SIZE: tl.constexpr, ROT_DIM: tl.constexpr, IS_NEOX: tl.constexpr,
                   BLOCK_HEADS: tl.constexpr, BLOCK_HALF: tl.constexpr,
                   BLOCK_PASS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    pair = tl.arange(0, BLOCK_HALF)
    pair_mask = pair < ROT_DIM // 2
    cos = tl.load(cache_ptr + position * cache_stride + pair, mask=pair_mask).to(tl.float32)
    sin = tl.load(cache_ptr + position * cache_stride + ROT_DIM // 2 + pair,
                  mask=pair_mask).to(tl.float32)
    _rotate_heads(q_ptr + token * q_stride_t, q_out_ptr + token * num_q_heads * HEAD_SIZE,
                  q_stride_h, num_q_heads, cos[None, :], sin[None, :], pair, pair_mask,
                  HEAD_SIZE, ROT_DIM, IS_NEOX, BLOCK_HEADS, BLOCK_PASS)
    _rotate_heads(k_ptr + token * k_stride_t, k_out_ptr + token * num_k_heads * HEAD_SIZE,
                  k_stride_h, num_k_heads, cos[None, :], sin[None, :], pair, pair_mask,
                  HEAD_SIZE, ROT_DIM, IS_NEOX, BLOCK_HEADS, BLOCK_PASS)


@triton.jit
def _rotate_heads(x_ptr, out_ptr, stride_h, num_heads, cos, sin, pair, pair_mask,
                  HEAD_SIZE: tl.constexpr, ROT_DIM: tl.constexpr, IS_NEOX: tl.constexpr,
                  BLOCK_HEADS: tl.constexpr, BLOCK_PASS: tl.constexpr):
    """Rotate the heads of one token: ``x_ptr`` with head stride ``stride_h`` into the
    contiguous ``out_ptr``."""
    if IS_NEOX:
        first, second = pair, pair + ROT_DIM // 2
    else:
        first, second = 2 * pair, 2 * pair + 1
    passed = ROT_DIM + tl.arange(0, BLOCK_PASS)
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        head_mask = heads[:, None] < num_heads
        x_rows, out_rows = x_ptr + heads[:, None] * stride_h, out_ptr + heads[:, None] * HEAD_SIZE
        mask = head_mask & pair_mask[None, :]
        x1 = tl.load(x_rows + first[None, :], mask=mask).to(tl.float32)
        x2 = tl.load(x_rows + second[None, :], mask=mask).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        tl.store(out_rows + first[None, :], (x1 * cos - x2 * sin).to(dtype), mask=mask)
        tl.store(out_rows + second[None, :], (x2 * cos + x1 * sin).to(dtype), mask=mask)
        if ROT_DIM < HEAD_SIZE:
            pass_mask = head_mask & (passed[None, :] < HEAD_SIZE)
            tl.store(out_rows + passed[None, :],
                     tl.load(x_rows + passed[None, :], mask=pass_mask), mask=pass_mask)
