"""Writing new keys and values into the paged KV cache (layout ``NHD``)."""

from __future__ import annotations

import torch


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store ``key``/``value [T, Hkv, D]`` into ``kv_cache [2, num_blocks, block_size, Hkv, D]``.

    Token ``t`` goes to slot ``s = slot_mapping[t]``: block ``s // block_size``, offset
    ``s % block_size``; keys into ``kv_cache[0]``, values into ``kv_cache[1]``, cast to the
    cache dtype. A negative slot marks a padding token and is skipped. Writes in place;
    every other slot is left untouched. (Dropping the padding tokens syncs with the host.)
    """
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    new_entries = torch.stack((key[keep], value[keep])).to(kv_cache.dtype)
    kv_cache[:, slots // block_size, slots % block_size] = new_entries
