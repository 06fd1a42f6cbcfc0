"""``reshape_and_cache``: write new keys and values into the paged KV cache (layout NHD).

Contract (the ``reshape_and_cache`` op): ``key``/``value [T, Hkv, D]``,
``kv_cache [2, num_blocks, block_size, Hkv, D]``, ``slot_mapping [T]`` int. Token ``t``
goes to block ``slot // block_size``, offset ``slot % block_size`` (keys in
``kv_cache[0]``, values in ``kv_cache[1]``), cast to the cache dtype; a negative slot is
skipped. Writes in place, one program per token, no host synchronisation.

supports: any float key/value/cache dtypes (bf16, fp16, fp32), any strides with a unit
last-dimension stride; see :func:`supported`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_cuda.kernels import checked
from hwplug_cuda.kernels.configs import launch_config


def supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return f"kv_cache must be [2, num_blocks, block_size, Hkv, D], got {tuple(kv_cache.shape)}"
    if key.shape != value.shape or key.shape[1:] != kv_cache.shape[3:]:
        return f"key {tuple(key.shape)} and value {tuple(value.shape)} must be " \
               f"[T, {kv_cache.shape[3]}, {kv_cache.shape[4]}]"
    if slot_mapping.shape != (key.shape[0],):
        return f"slot_mapping {tuple(slot_mapping.shape)} must be [{key.shape[0]}]"
    if kv_cache.stride(-1) != 1:
        return "kv_cache needs a unit stride in its last dimension"
    return None


@checked(supported)
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """The ``reshape_and_cache`` op (see the module docstring)."""
    num_tokens, num_heads, head_size = key.shape
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    config = launch_config("reshape_and_cache", key.device, head_size)
    block_d = triton.next_power_of_2(head_size)
    _cache_kernel[(num_tokens,)](
        key, value, kv_cache, slot_mapping, num_heads,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        BLOCK_SIZE=kv_cache.shape[2], HEAD_SIZE=head_size, BLOCK_D=block_d,
        BLOCK_HEADS=max(1, config["tile"] // block_d), num_warps=config["num_warps"])


@triton.jit
def _cache_kernel(key_ptr, value_ptr, cache_ptr, slot_mapping_ptr, num_heads,
                  key_stride_t, key_stride_h, value_stride_t, value_stride_h,
                  cache_stride_kv, cache_stride_block, cache_stride_slot, cache_stride_h,
                  BLOCK_SIZE: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_HEADS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    slot_ptr = cache_ptr + (slot // BLOCK_SIZE) * cache_stride_block \
        + (slot % BLOCK_SIZE) * cache_stride_slot
    dims = tl.arange(0, BLOCK_D)
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        mask = (heads[:, None] < num_heads) & (dims[None, :] < HEAD_SIZE)
        key = tl.load(key_ptr + token * key_stride_t + heads[:, None] * key_stride_h
                      + dims[None, :], mask=mask)
        value = tl.load(value_ptr + token * value_stride_t + heads[:, None] * value_stride_h
                        + dims[None, :], mask=mask)
        target = slot_ptr + heads[:, None] * cache_stride_h + dims[None, :]
        dtype = cache_ptr.dtype.element_ty
        tl.store(target, key.to(dtype), mask=mask)
        tl.store(target + cache_stride_kv, value.to(dtype), mask=mask)
