"""``reshape_and_cache`` into a ``ROCM_PA`` cache: hwplug-triton's cache-write kernel over
the layout's :class:`~hwplug_triton.kernels.layouts.CacheView`.

Contract (the ``reshape_and_cache`` op, ``params.layout`` being
:data:`~hwplug_rocm_aiter.layout.ROCM_PA`): that of ``reshape_and_cache`` with
``kv_cache [2, num_blocks, Hkv, D, block_size]`` (keys in 16-byte chunks,
``[D // x, block_size, x]`` per block and head; values ``[D, block_size]``). Registered
with ``layouts=("ROCM_PA",)``.

supports: as :mod:`hwplug_triton.kernels.cache`, with a contiguous cache whose head size
is a multiple of ``x``; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug_rocm_aiter.layout import ROCM_PA, chunk_elements
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.cache import check_write, write
from hwplug_triton.kernels.layouts import CacheView, Half

if TYPE_CHECKING:
    from hwplug.attention import PagedAttentionParams


def rocm_pa_view(kv_cache: torch.Tensor) -> CacheView:
    """``kv_cache [2, num_blocks, Hkv, D, block_size]`` in layout ``ROCM_PA`` (contiguous),
    as hwplug-triton's kernels address it: keys in chunks of ``x`` (stride ``bs * x``)
    with slots ``x`` apart, values with slots 1 apart."""
    _, _, num_kv_heads, head_size, block_size = kv_cache.shape
    x = chunk_elements(kv_cache.dtype)
    head = head_size * block_size
    block = num_kv_heads * head
    keys = Half(kv_cache[0], block, x, head, block_size * x, x)
    values = Half(kv_cache[1], block, 1, head, block_size, 1)
    return CacheView(keys, values, block_size, num_kv_heads, head_size)


def supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    return ROCM_PA.check(kv_cache) or check_write(
        key, value, rocm_pa_view(kv_cache), kv_cache.dtype, slot_mapping, params)


@checked(supported)
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache`` op over a ``ROCM_PA`` cache (see the module docstring)."""
    write(key, value, rocm_pa_view(kv_cache), slot_mapping, params)
