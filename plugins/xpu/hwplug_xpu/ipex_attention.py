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

import torch

_DTYPES = (torch.bfloat16, torch.float16)


def cache_supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> str | None:
    """Why IPEX cannot write this call, or None."""
    if kv_cache.dtype not in _DTYPES or kv_cache.dtype != key.dtype:
        return f"needs a bf16 / fp16 cache in the keys' dtype, got {kv_cache.dtype}"
    if k_scale is not None or v_scale is not None:
        return "no k/v scales"
    return None


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None) -> None:
    """The ``reshape_and_cache`` op for a call :func:`cache_supported` accepts."""
    from intel_extension_for_pytorch.llm.modules import PagedAttention

    PagedAttention.reshape_and_cache_flash(key, value, kv_cache[0], kv_cache[1], slot_mapping)


def attention_supported(query: torch.Tensor, kv_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor,
                        query_start_loc: torch.Tensor, scale: float, causal: bool = True,
                        sliding_window: int | None = None, soft_cap: float | None = None,
                        max_query_len: int | None = None, max_seq_len: int | None = None,
                        k_scale: torch.Tensor | None = None,
                        v_scale: torch.Tensor | None = None) -> str | None:
    """Why IPEX cannot serve this call, or None (no device sync)."""
    if query.dtype not in _DTYPES or kv_cache.dtype != query.dtype:
        return f"needs bf16 / fp16 queries and a cache in their dtype, got {query.dtype} " \
               f"and {kv_cache.dtype}"
    if k_scale is not None or v_scale is not None:
        return "no k/v scales"
    if max_query_len is None or max_seq_len is None:
        return "needs max_query_len and max_seq_len (host-side maxima)"
    return None


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    causal: bool = True, sliding_window: int | None = None,
                    soft_cap: float | None = None, max_query_len: int | None = None,
                    max_seq_len: int | None = None, k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The ``paged_attention`` op for a call :func:`attention_supported` accepts. A window
    of ``w`` keys is flash attention's ``window_size_left = w - 1``."""
    from intel_extension_for_pytorch.llm.modules import PagedAttention

    out = torch.empty_like(query)
    key_starts = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    PagedAttention.flash_attn_varlen_func(
        out, query.contiguous(), kv_cache[0], kv_cache[1], query_start_loc, key_starts,
        max_query_len, max_seq_len, scale, causal, block_tables, None,
        softcap=soft_cap or 0.0,
        window_size_left=sliding_window - 1 if sliding_window is not None else -1,
        window_size_right=-1)
    return out
