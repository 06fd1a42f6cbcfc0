"""The ops of the interleaved paged KV layout, the one JAX's ragged paged attention reads
(see :mod:`hwplug.kernel_registry.reference.interleaved_kv`).

``reshape_and_cache_interleaved`` and ``paged_attention_interleaved`` have the contracts
of ``reshape_and_cache`` and ``paged_attention``, k/v scales included, over a cache in
that layout instead of ``NHD``. Their references run the ``NHD`` references on a view of
the same memory, and they state the same tolerances. hwplug-tpu's ``PALLAS_RPA``
backend declares this layout and computes through these ops.
"""

from __future__ import annotations

from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.ops import paged_attention, reshape_and_cache

__all__ = ["paged_attention_interleaved", "reshape_and_cache_interleaved"]

_REF = "hwplug.kernel_registry.reference.interleaved_kv:"
_CACHE = """kv_pages [num_blocks, block_size, 2 * Hkv, D] (interleaved): KV head h's key at
    head index 2h, its value at 2h + 1."""

reshape_and_cache_interleaved = kernels.define_op(
    "reshape_and_cache_interleaved", _REF + "reshape_and_cache_interleaved",
    tolerances=reshape_and_cache.tolerances, doc=f"""
reshape_and_cache_interleaved(key [T, Hkv, D], value [T, Hkv, D], kv_pages,
                              slot_mapping [T] int64, params: PagedAttentionParams)
    reshape_and_cache into {_CACHE}
""")

paged_attention_interleaved = kernels.define_op(
    "paged_attention_interleaved", _REF + "paged_attention_interleaved",
    tolerances=paged_attention.tolerances, doc=f"""
paged_attention_interleaved(query [T, Hq, D], kv_pages, metadata: AttentionMetadata,
                            params: PagedAttentionParams) -> [T, Hq, D]
    paged_attention over {_CACHE}
""")
