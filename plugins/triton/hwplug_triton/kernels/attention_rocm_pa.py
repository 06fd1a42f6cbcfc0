"""``paged_attention_rocm_pa``: the attention kernels of :mod:`.attention` over a
``ROCM_PA`` cache.

Contract (the ``paged_attention_rocm_pa`` op): that of ``paged_attention`` with
``kv_cache [2, num_blocks, Hkv, D, block_size]`` in layout ``ROCM_PA`` (keys in 16-byte
chunks, ``[D // x, block_size, x]`` per block and head; values ``[D, block_size]``).

supports: as :mod:`.attention`, with a contiguous cache whose head size is a multiple of
``x``; see :func:`supported`.
"""

from __future__ import annotations

import torch

from hwplug.kernel_registry.reference import rocm_pa
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.attention import attend, check_attention
from hwplug_triton.kernels.layouts import rocm_pa_view


def supported(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
              causal: bool = True, sliding_window: int | None = None,
              soft_cap: float | None = None, max_query_len: int | None = None,
              max_seq_len: int | None = None, k_scale: torch.Tensor | None = None,
              v_scale: torch.Tensor | None = None) -> str | None:
    """Why these kernels cannot serve the call, or None (no device sync)."""
    return rocm_pa.check_cache(kv_cache) or check_attention(
        query, rocm_pa_view(kv_cache), kv_cache.dtype, block_tables, seq_lens, query_start_loc,
        causal, sliding_window, soft_cap, k_scale, v_scale)


@checked(supported)
def paged_attention_rocm_pa(query: torch.Tensor, kv_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor,
                            query_start_loc: torch.Tensor, scale: float, causal: bool = True,
                            sliding_window: int | None = None, soft_cap: float | None = None,
                            max_query_len: int | None = None, max_seq_len: int | None = None,
                            k_scale: torch.Tensor | None = None,
                            v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The ``paged_attention_rocm_pa`` op (see the module docstring)."""
    return attend(query, rocm_pa_view(kv_cache), block_tables, seq_lens, query_start_loc, scale,
                  causal, sliding_window, soft_cap, max_query_len, max_seq_len, k_scale,
                  v_scale)
