"""``reshape_and_cache_rocm_pa``: the cache write of :mod:`.cache` into a ``ROCM_PA`` cache.

Contract (the ``reshape_and_cache_rocm_pa`` op): that of ``reshape_and_cache`` with
``kv_cache [2, num_blocks, Hkv, D, block_size]`` in layout ``ROCM_PA`` (keys in 16-byte
chunks, ``[D // x, block_size, x]`` per block and head; values ``[D, block_size]``).

supports: as :mod:`.cache`, with a contiguous cache whose head size is a multiple of
``x``; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug.kernel_registry.reference import rocm_pa
from hwplug_triton.kernels import checked
from hwplug_triton.kernels.cache import check_write, write
from hwplug_triton.kernels.layouts import rocm_pa_view

if TYPE_CHECKING:
    from hwplug.attention import PagedAttentionParams


def supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    return rocm_pa.check_cache(kv_cache) or check_write(
        key, value, rocm_pa_view(kv_cache), kv_cache.dtype, slot_mapping, params)


@checked(supported)
def reshape_and_cache_rocm_pa(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                              slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache_rocm_pa`` op (see the module docstring)."""
    write(key, value, rocm_pa_view(kv_cache), slot_mapping, params)
