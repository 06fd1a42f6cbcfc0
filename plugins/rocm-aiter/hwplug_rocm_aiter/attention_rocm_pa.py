"""``paged_attention`` over a ``ROCM_PA`` cache: hwplug-triton's attention kernels over the
layout's :class:`~hwplug_triton.kernels.layouts.CacheView`.

Contract (the ``paged_attention`` op, ``params.layout`` being
:data:`~hwplug_rocm_aiter.layout.ROCM_PA`): that of ``paged_attention`` with
``kv_cache [2, num_blocks, Hkv, D, block_size]`` (keys in 16-byte chunks,
``[D // x, block_size, x]`` per block and head; values ``[D, block_size]``). Registered
with ``layouts=("ROCM_PA",)``.

supports: as :mod:`hwplug_triton.kernels.attention`, with a contiguous cache whose head
size is a multiple of ``x``; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug_rocm_aiter.cache_rocm_pa import rocm_pa_view
from hwplug_rocm_aiter.layout import ROCM_PA
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.attention import attend, check_attention

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams


def supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
              params: PagedAttentionParams) -> str | None:
    """Why these kernels cannot serve the call, or None (no device sync)."""
    return ROCM_PA.check(kv_cache) or check_attention(
        query, rocm_pa_view(kv_cache), kv_cache.dtype, metadata, params)


@checked(supported)
def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op over a ``ROCM_PA`` cache (see the module docstring)."""
    return attend(query, rocm_pa_view(kv_cache), metadata, params)
