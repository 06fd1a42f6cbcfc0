"""The CPU platform's mixture-of-experts variants: tokens grouped by expert.

:func:`grouped_experts` sorts the ``T * k`` (token, slot) pairs by expert once, gathers
each expert's tokens into one contiguous run, and runs each *active* expert's MLP once
over its run (experts no token chose are skipped; a decode step with top-8 runs 8 MLPs
of one row each, whatever the expert count). The matmuls go through the registry's
``linear`` op (the C GEMV/GEMM for fp32); the weighted rows are summed back per token with
one ``index_add_``. GGUF experts have variants of their own (:mod:`.ggml_moe`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hwplug.kernel_registry import ops
from hwplug.kernel_registry.moe_compose import fused_supported, gated
from hwplug.kernel_registry.reference.moe import check_experts

#: One expert's projection: ``(rows [n, in], expert) -> [n, out]``.
Project = Callable[[torch.Tensor, int], torch.Tensor]


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
    start = 0
    for expert, count in enumerate(counts.tolist()):
        if count:
            run = rows[start:start + count]
            out_rows[start:start + count] = down(act(up(run, expert)), expert)
            start += count
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
