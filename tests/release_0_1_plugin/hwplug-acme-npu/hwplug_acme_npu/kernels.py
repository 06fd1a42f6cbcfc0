"""Kernel variants of hwplug-acme-npu. Each function has exactly its op's signature.

The template's variant computes with torch ops, so it is correct from the start; replace
the body with a call into your kernel library and keep the contract (see
``hwplug.ops.silu_and_mul.__doc__``). The conformance kit compares it with the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x [..., 2d] -> [..., d]`` = ``silu(x[..., :d]) * x[..., d:]``, fp32 inside."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    causal: bool = True, sliding_window: int | None = None,
                    soft_cap: float | None = None, max_query_len: int | None = None,
                    max_seq_len: int | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Release 0.1's paged_attention signature, computed by the reference (added to the
    scaffold's output: a vendor's variant written against that release)."""
    from hwplug import ops

    return ops.paged_attention.reference(
        query, kv_cache, block_tables, seq_lens, query_start_loc, scale, causal,
        sliding_window, soft_cap, max_query_len, max_seq_len, k_scale, v_scale)
