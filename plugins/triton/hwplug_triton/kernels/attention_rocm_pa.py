"""``paged_attention_rocm_pa``: the attention kernels of :mod:`.attention` over a
``ROCM_PA`` cache.

Contract (the ``paged_attention_rocm_pa`` op): that of ``paged_attention`` with
``kv_cache [2, num_blocks, Hkv, D, block_size]`` in layout ``ROCM_PA`` (keys in 16-byte
chunks, ``[D // x, block_size, x]`` per block and head; values ``[D, block_size]``).

supports: as :mod:`.attention`, with a contiguous cache whose head size is a multiple of
``x``; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug.kernel_registry.reference import rocm_pa
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.attention import attend, check_attention
from hwplug_triton.kernels.layouts import rocm_pa_view

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams


def supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
              params: PagedAttentionParams) -> str | None:
    """Why these kernels cannot serve the call, or None (no device sync)."""
    return rocm_pa.check_cache(kv_cache) or check_attention(
        query, rocm_pa_view(kv_cache), kv_cache.dtype, metadata, params)


@checked(supported)
def paged_attention_rocm_pa(query: torch.Tensor, kv_cache: torch.Tensor,
                            metadata: AttentionMetadata, params: PagedAttentionParams
                            ) -> torch.Tensor:
    """The ``paged_attention_rocm_pa`` op (see the module docstring)."""
    return attend(query, rocm_pa_view(kv_cache), metadata, params)
