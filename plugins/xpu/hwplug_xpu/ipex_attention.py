"""The KV-cache write and paged attention through intel-extension-for-pytorch (IPEX).

IPEX's ``ipex.llm.modules.PagedAttention.reshape_and_cache_flash`` and
``flash_attn_varlen_func`` serve prefill, chunked prefill and decode in one call. They
compute in bf16 / fp16 only (a float32 model falls back to hwplug-triton's kernels, vLLM
#31762) and take no fp8 cache scales here: :func:`cache_supported` and
:func:`attention_supported` decline those calls with the reason, and the registry's next
variant serves them. The calls follow the ``PagedAttention`` frontend of IPEX 2.7 and 2.8
(:data:`hwplug_xpu.plugin.IPEX_REQUIREMENT`; 2.6 has no ``reshape_and_cache_flash`` and no
window or soft cap): "no soft cap" is its default ``softcap=-1.0``, a window of ``w`` keys
is ``window_size_left = w - 1``.

Where the cache lives decides how it is handed over:

* XPU tensors: the ``NHD`` caches as they are (``kv_cache[0]`` / ``kv_cache[1]`` are the
  key and value caches ``[num_blocks, block_size, Hkv, D]``) and padding slots left in,
  as vLLM's XPU backend passes them (not executed here: it needs an Intel GPU).
* CPU tensors (IPEX's CPU build, which runs the same frontend calls; ``make test-ipex``):
  its kernels index the caches as ``[num_blocks, Hkv, block_size, D]`` and write padding
  slots out of bounds. The write goes through the ``NHD`` cache's transposed view (the
  kernel honours strides) with the padding dropped; attention reads a contiguous copy in
  that order (its kernel does not honour strides). A correctness path for testing the
  calls, not a fast one: the variants are registered for the ``xpu`` platform only.

IPEX is imported on the first call, never at import; the variants' package gate keeps
them from being considered without a matching ``intel-extension-for-pytorch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

_DTYPES = (torch.bfloat16, torch.float16)
#: ``flash_attn_varlen_func``'s "no soft cap" (its default; 0.0 is not "off" on the CPU build)
_NO_SOFT_CAP = -1.0


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

    if kv_cache.device.type == "cpu":
        kept = slot_mapping >= 0
        key, value, slot_mapping = key[kept], value[kept], slot_mapping[kept]
    PagedAttention.reshape_and_cache_flash(key, value, *_caches(kv_cache, copy=False),
                                          slot_mapping)


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


def _caches(kv_cache: torch.Tensor, *, copy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value caches as the IPEX build of ``kv_cache``'s device reads them: the
    ``NHD`` caches on an XPU; on the CPU ``[num_blocks, Hkv, block_size, D]`` views of
    them, or with ``copy`` contiguous copies (see the module doc)."""
    if kv_cache.device.type != "cpu":
        return kv_cache[0], kv_cache[1]
    caches = kv_cache.transpose(2, 3)
    if copy:
        caches = caches.contiguous()
    return caches[0], caches[1]


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op for a call :func:`attention_supported` accepts."""
    from intel_extension_for_pytorch.llm.modules import PagedAttention

    key_cache, value_cache = _caches(kv_cache, copy=True)
    out = torch.empty_like(query)
    seq_lens, window = metadata.seq_lens, params.sliding_window
    key_starts = torch.nn.functional.pad(seq_lens.cumsum(0, dtype=torch.int32), (1, 0))
    PagedAttention.flash_attn_varlen_func(
        out, query.contiguous(), key_cache, value_cache, metadata.query_start_loc,
        key_starts, metadata.max_query_len, metadata.max_seq_len, params.scale, params.causal,
        metadata.block_tables, None,
        window_size_left=window - 1 if window is not None else -1, window_size_right=-1,
        softcap=params.soft_cap if params.soft_cap is not None else _NO_SOFT_CAP)
    return out
