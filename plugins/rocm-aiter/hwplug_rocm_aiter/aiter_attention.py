"""``paged_attention`` over a ``ROCM_PA`` cache through AMD's AITER library
(``aiter.paged_attention_rocm``), registered with ``layouts=("ROCM_PA",)``.

AITER's paged attention reads the ``ROCM_PA`` layout directly (keys
``[num_blocks, Hkv, D // x, block_size, x]``, values ``[num_blocks, Hkv, D, block_size]``)
and serves decode batches. What it does not serve, :func:`supported` declines with the
reason, and the registry's next variant (``triton_rocm_pa``, hwplug-triton's kernel over
the same cache) serves the call: prefill and mixed batches, sliding windows and head sizes
below 64 (its decode kernel then skips the value loop: vLLM #34570), soft caps, fp8
caches and block sizes other than 16 / 32. ``ROCM_AITER`` states these as its internal
fallbacks.

The call itself is :func:`hwplug_rocm_aiter.aiter_api.paged_attention` (the variant's
``impl``), whose module imports ``aiter`` and checks its signature when the variant loads;
this module needs no ``aiter`` (the variant's ``supports`` is here), and the variant's
package gate keeps it from being considered without the ``amd-aiter`` package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug_rocm_aiter.layout import ROCM_PA

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: Head sizes AITER's paged-attention decode kernel serves.
AITER_HEAD_SIZES = (64, 128)
#: Block sizes it serves.
AITER_BLOCK_SIZES = (16, 32)
#: Keys per partition of its split-KV decode (the size its workspaces are laid out for).
PARTITION_SIZE = 256


def supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
              params: PagedAttentionParams) -> str | None:
    """Why AITER cannot serve this call, or None (no device sync)."""
    if metadata.max_query_len != 1 or query.shape[0] != metadata.seq_lens.shape[0]:
        return "serves decode batches (every query length 1); the Triton kernel serves " \
               "prefill and mixed batches"
    if params.sliding_window is not None:
        return "sliding window: the Triton kernel serves it (vLLM #34570)"
    if query.shape[-1] not in AITER_HEAD_SIZES:
        return f"head size {query.shape[-1]} not in 64, 128 (below 64 its decode kernel " \
               "skips the value loop, vLLM #34570)"
    if params.soft_cap is not None:
        return "no logit soft cap"
    if kv_cache.dtype != query.dtype or params.k_scale is not None or \
            params.v_scale is not None:
        return "needs an unscaled KV cache in the query's dtype (fp8 caches take the " \
               "Triton kernel)"
    problem = ROCM_PA.check(kv_cache)
    if problem:
        return problem
    if kv_cache.shape[-1] not in AITER_BLOCK_SIZES:
        return f"block size {kv_cache.shape[-1]} not in 16, 32"
    return None
