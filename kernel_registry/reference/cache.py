"""Writing new keys and values into the paged KV cache (any layout, through ``NHD``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hwplug.kv_cache_layout import NHD, checked_reference

if TYPE_CHECKING:
    from hwplug.attention import PagedAttentionParams


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """Store ``key``/``value [T, Hkv, D]`` into ``kv_cache``, a cache in layout
    ``params.layout``.

    In ``NHD`` (``[2, num_blocks, block_size, Hkv, D]``), token ``t`` goes to slot
    ``s = slot_mapping[t]``: block ``s // block_size``, offset ``s % block_size``; keys into
    ``kv_cache[0]``, values into ``kv_cache[1]``, divided by ``params.k_scale`` /
    ``params.v_scale`` when given (float32, ``[]`` or ``[Hkv]``) and cast to the cache
    dtype. A negative slot marks a padding token and is skipped. Writes in place; every
    other slot is left untouched. A cache of another layout is written through its
    ``to_reference`` view, or converted, written and converted back with
    ``from_reference``. (Dropping the padding tokens syncs with the host.)
    """
    layout = params.layout
    reference = kv_cache if layout is NHD else checked_reference(layout, kv_cache)
    _write_nhd(key, value, reference, slot_mapping, params)
    if not layout.reference_is_view:
        layout.from_reference(reference, kv_cache)


def _write_nhd(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
               slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    new_entries = torch.stack((quantize(key[keep], params.k_scale, kv_cache.dtype),
                               quantize(value[keep], params.v_scale, kv_cache.dtype)))
    kv_cache[:, slots // block_size, slots % block_size] = new_entries


def quantize(x: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``x [T, Hkv, D] / scale`` (per tensor or per KV head) in ``dtype``; fp8 saturates at
    its largest finite value instead of overflowing to NaN."""
    if scale is None:
        return x.to(dtype)
    scaled = x.float() / scale.float().reshape(-1, 1)
    if dtype.itemsize == 1 and dtype.is_floating_point:
        bound = torch.finfo(dtype).max
        scaled = scaled.clamp(-bound, bound)
    return scaled.to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x [..., Hkv, L, D]`` as float32 times ``scale`` (per tensor or per KV head)."""
    x = x.float()
    return x if scale is None else x * scale.float().reshape(-1, 1, 1)
