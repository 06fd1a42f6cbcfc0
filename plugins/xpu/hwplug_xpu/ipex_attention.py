"""The KV-cache write and paged attention through intel-extension-for-pytorch (IPEX).

IPEX's ``PagedAttention.reshape_and_cache_flash`` and ``flash_attn_varlen_func`` read the
``NHD`` layout hwplug uses (``kv_cache[0]`` / ``kv_cache[1]`` are its key and value caches
``[num_blocks, block_size, Hkv, D]``) and serve prefill, chunked prefill and decode in one
call. They compute in bf16 / fp16 only (a float32 model falls back to hwplug-triton's
kernels, vLLM #31762) and take no fp8 cache scales here: :func:`cache_supported` and
:func:`attention_supported` decline those calls with the reason, and the registry's next
variant serves them.

IPEX is imported on the first call, never at import; the variants' package gate keeps
them from being considered without the ``intel-extension-for-pytorch`` package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

_DTYPES = (torch.bfloat16, torch.float16)


def cache_supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why IPEX cannot write this call, or None."""
    if kv_cache.dtype not in _DTYPES or kv_cache.dtype != key.dtype:
        return f"needs a bf16 / fp16 cache in the keys' dtype, got {kv_cache.dtype}"
    return _scales_problem(params)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache`` op for a call :func:`cache_supported` accepts."""
    from intel_extension_for_pytorch.llm.modules import PagedAttention

    PagedAttention.reshape_and_cache_flash(key, value, kv_cache[0], kv_cache[1], slot_mapping)


def attention_supported(query: torch.Tensor, kv_cache: torch.Tensor,
                        metadata: AttentionMetadata, params: PagedAttentionParams
                        ) -> str | None:
    """Why IPEX cannot serve this call, or None (no device sync)."""
    if query.dtype not in _DTYPES or kv_cache.dtype != query.dtype:
        return f"needs bf16 / fp16 queries and a cache in their dtype, got {query.dtype} " \
               f"and {kv_cache.dtype}"
    return _scales_problem(params)


def _scales_problem(params: PagedAttentionParams) -> str | None:
    if params.k_scale is not None or params.v_scale is not None:
        return "no k/v scales"
    return None


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op for a call :func:`attention_supported` accepts. A window
    of ``w`` keys is flash attention's ``window_size_left = w - 1``."""
    from intel_extension_for_pytorch.llm.modules import PagedAttention

    out = torch.empty_like(query)
    seq_lens, window = metadata.seq_lens, params.sliding_window
    key_starts = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    PagedAttention.flash_attn_varlen_func(
        out, query.contiguous(), kv_cache[0], kv_cache[1], metadata.query_start_loc,
        key_starts, metadata.max_query_len, metadata.max_seq_len, params.scale, params.causal,
        metadata.block_tables, None, softcap=params.soft_cap or 0.0,
        window_size_left=window - 1 if window is not None else -1, window_size_right=-1)
    return out
