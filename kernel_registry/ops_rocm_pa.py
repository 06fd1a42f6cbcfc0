"""The ops of the ``ROCM_PA`` KV-cache layout (see :mod:`hwplug.kernel_registry.reference.rocm_pa`).

``reshape_and_cache_rocm_pa`` and ``paged_attention_rocm_pa`` have the contracts of
``reshape_and_cache`` and ``paged_attention``, k/v scales included, over a cache in the
layout ROCm's paged attention reads instead of ``NHD``. Their references convert to
``NHD`` and call the ``NHD`` references, and they state the same tolerances.
"""

from __future__ import annotations

from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.ops import paged_attention, reshape_and_cache

__all__ = ["paged_attention_rocm_pa", "reshape_and_cache_rocm_pa"]

_REF = "hwplug.kernel_registry.reference.rocm_pa:"
_CACHE = """kv_cache [2, num_blocks, Hkv, D, block_size] (layout ROCM_PA): kv_cache[1] is V as
    [num_blocks, Hkv, D, block_size]; kv_cache[0] holds K ordered [D // x, block_size, x]
    per (block, head), x = 16 bytes // element size (D a multiple of x)."""

reshape_and_cache_rocm_pa = kernels.define_op(
    "reshape_and_cache_rocm_pa", _REF + "reshape_and_cache_rocm_pa",
    tolerances=reshape_and_cache.tolerances, doc=f"""
reshape_and_cache_rocm_pa(key [T, Hkv, D], value [T, Hkv, D], kv_cache, slot_mapping [T] int64,
                          params: PagedAttentionParams)
    reshape_and_cache into {_CACHE}
""")

paged_attention_rocm_pa = kernels.define_op(
    "paged_attention_rocm_pa", _REF + "paged_attention_rocm_pa",
    tolerances=paged_attention.tolerances, doc=f"""
paged_attention_rocm_pa(query [T, Hq, D], kv_cache, metadata: AttentionMetadata,
                        params: PagedAttentionParams) -> [T, Hq, D]
    paged_attention over {_CACHE}
""")
