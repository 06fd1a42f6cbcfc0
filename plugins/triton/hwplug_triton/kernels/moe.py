"""``moe_experts``: the experts' MLPs as two grouped GEMMs over tokens sorted by expert.

Contract (the ``moe_experts`` op, :mod:`hwplug.kernel_registry.ops_moe`): ``x [T, H]``
fp32 / bf16 / fp16, ``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` in x's dtype, ``topk_weights
[T, k]`` and ``topk_ids [T, k]``; returns ``[T, H]`` in ``x.dtype``.

As vLLM's fused MoE does: the ``T * k`` (token, slot) pairs are sorted by expert and each
expert's run is padded to a multiple of ``BLOCK_M`` (:func:`align_by_expert`), so every
row tile of the sorted pairs belongs to one expert, which its programs read the weight
of; experts no token chose get no tile. The first GEMM gathers the tokens' rows of ``x``
and writes ``w13[e] @ x`` per pair, the gated activation kernel follows, and the second
GEMM multiplies by ``w2[e]`` and the routing weight, writing each pair's row; the ``k``
rows of a token are summed in fp32. Tiles come from the ``moe_matmul`` tuning table,
bucketed by the number of pairs.

supports: x fp32 / bf16 / fp16, weights of x's dtype; see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug.kernel_registry.reference.moe import ACTIVATIONS
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.activation import gelu_and_mul, silu_and_mul
from hwplug_triton.kernels.functions import interpreter_widens
from hwplug_triton.kernels.layouts import COMPUTE_DTYPES
from hwplug_triton.tuning import launch_config

_GATED = {"silu": silu_and_mul.unchecked, "gelu": gelu_and_mul.unchecked}


def supported(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              activation: str = "silu") -> str | None:
    """Why this kernel cannot serve the call, or None."""
    if x.dtype not in COMPUTE_DTYPES:
        return f"x dtype {x.dtype} not in fp32, bf16, fp16"
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        return f"needs w13 and w2 in x's dtype {x.dtype}, got {w13.dtype} and {w2.dtype}"
    if activation not in ACTIVATIONS:
        return f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}"
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or w13.shape[2] != x.shape[1]:
        return (f"needs x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got {tuple(x.shape)}, "
                f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    return None


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pairs, tile_experts)``: the pair indices ``t * k + j`` sorted by expert, each
    expert's run padded with ``T * k`` (no pair) to a multiple of ``block_m``; and the
    expert of each row tile of ``pairs``. Computed on the ids' device, no host sync."""
    flat = topk_ids.reshape(-1)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = padded.cumsum(0) - padded
    order = flat.argsort(stable=True)
    run_starts = counts.cumsum(0) - counts
    sorted_experts = flat[order]
    slots = starts[sorted_experts] + torch.arange(flat.numel(), device=flat.device) \
        - run_starts[sorted_experts]
    bound = flat.numel() + num_experts * (block_m - 1)  # at least sum(padded)
    total = triton.cdiv(bound, block_m) * block_m
    pairs = torch.full((total,), flat.numel(), dtype=torch.int64, device=flat.device)
    pairs[slots] = order
    tiles = torch.arange(0, total, block_m, device=flat.device)
    tile_experts = torch.searchsorted(starts + padded, tiles, right=True)
    return pairs, tile_experts.clamp(max=num_experts - 1).masked_fill(
        tiles >= padded.sum(), -1)


@checked(supported)
def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """The ``moe_experts`` op (see the module docstring)."""
    num_tokens, k = topk_ids.shape
    pairs_total = num_tokens * k
    config = launch_config("moe_matmul", x.device, pairs_total)
    block_m = config["block_m"]
    pairs, tile_experts = align_by_expert(topk_ids, w13.shape[0], block_m)
    rows = x.contiguous()
    hidden = rows.new_empty((pairs_total, w13.shape[1]))
    _grouped_gemm(rows, w13.contiguous(), hidden, pairs, tile_experts, None, k, config)
    act = _GATED[activation](hidden)
    out = torch.empty((pairs_total, w2.shape[1]), dtype=torch.float32, device=x.device)
    _grouped_gemm(act, w2.contiguous(), out, pairs, tile_experts,
                  topk_weights.reshape(-1).float().contiguous(), 1, config)
    return out.view(num_tokens, k, -1).sum(1).to(x.dtype)


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, out: torch.Tensor, pairs: torch.Tensor,
                  tile_experts: torch.Tensor, weights: torch.Tensor | None, row_div: int,
                  config: dict) -> None:
    """``out[p] = w[expert(p)] @ a[p // row_div]`` (times ``weights[p]`` when given) for
    every pair ``p`` of ``pairs``."""
    n, k = w.shape[1], w.shape[2]
    block_n, block_k = config["block_n"], config["block_k"]
    grid = (tile_experts.shape[0], triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](
        a, w, out, pairs, tile_experts, a if weights is None else weights, out.shape[0], n, k,
        row_div, w.stride(0), HAS_WEIGHTS=weights is not None,
        WIDEN_DOT=interpreter_widens(a.dtype, a.device), BLOCK_M=config["block_m"],
        BLOCK_N=block_n, BLOCK_K=block_k, num_warps=config["num_warps"],
        num_stages=config["num_stages"])


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, out_ptr, pairs_ptr, tile_experts_ptr, weights_ptr,
                         num_pairs, N, K, row_div, expert_stride, HAS_WEIGHTS: tl.constexpr,
                         WIDEN_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row tile ``program_id(0)`` of the sorted pairs (one expert's) by column tile
    ``program_id(1)``; a tile of padding only (expert -1) does nothing."""
    expert = tl.load(tile_experts_ptr + tl.program_id(0)).to(tl.int64)
    if expert >= 0:
        offsets = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        pair = tl.load(pairs_ptr + offsets)
        valid = pair < num_pairs
        a_row = (pair // row_div).to(tl.int64)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        w_base = w_ptr + expert * expert_stride + rn.to(tl.int64)[None, :] * K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            kk = start + tl.arange(0, BLOCK_K)
            a = tl.load(a_ptr + a_row[:, None] * K + kk[None, :],
                        mask=valid[:, None] & (kk[None, :] < K), other=0.0)
            w = tl.load(w_base + kk[:, None], mask=(kk[:, None] < K) & (rn[None, :] < N),
                        other=0.0)  # [BLOCK_K, BLOCK_N] = w[expert].T's tile
            if WIDEN_DOT:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision="ieee")
        if HAS_WEIGHTS:
            acc *= tl.load(weights_ptr + pair, mask=valid, other=0.0)[:, None]
        out = out_ptr + pair.to(tl.int64)[:, None] * N + rn[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (rn[None, :] < N))
