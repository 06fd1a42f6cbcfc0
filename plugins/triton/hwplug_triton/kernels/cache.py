"""``reshape_and_cache``: write new keys and values into the paged KV cache (layout NHD).

Contract (the ``reshape_and_cache`` op): ``key``/``value [T, Hkv, D]``,
``kv_cache [2, num_blocks, block_size, Hkv, D]``, ``slot_mapping [T]`` int, the layer's
``params``. Token ``t`` goes to block ``slot // block_size``, offset ``slot % block_size``
(keys in ``kv_cache[0]``, values in ``kv_cache[1]``), divided by ``params.k_scale`` /
``params.v_scale`` when given (``[]`` or ``[Hkv]``), clamped to the largest finite value of an fp8 cache, cast to
the cache dtype; a negative slot is skipped. Writes in place, one program per token, no
host synchronisation. :func:`write` serves every layout (see :mod:`.layouts`).

supports: key/value fp32, bf16 or fp16; caches in those or fp8 (e4m3fn, e5m2 and the
fnuz flavours); any strides with a unit last-dimension stride; see :func:`supported`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import checked
from hwplug_triton.kernels.functions import chunked, round_to_fp8_grid
from hwplug_triton.kernels.layouts import (
    CACHE_DTYPES,
    COMPUTE_DTYPES,
    CacheView,
    fp8_format,
    head_scales,
    nhd_view,
    scale_problem,
)
from hwplug_triton.tuning import launch_config

if TYPE_CHECKING:
    from hwplug.attention import PagedAttentionParams


def check_write(key: torch.Tensor, value: torch.Tensor, view: CacheView, cache_dtype: torch.dtype,
                slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why :func:`write` cannot store ``key``/``value`` into the cache ``view``, or None."""
    expected = (view.num_kv_heads, view.head_size)
    if key.dim() != 3 or key.shape != value.shape or tuple(key.shape[1:]) != expected:
        return f"key {tuple(key.shape)} and value {tuple(value.shape)} must be " \
               f"[T, {expected[0]}, {expected[1]}]"
    if key.dtype not in COMPUTE_DTYPES or value.dtype not in COMPUTE_DTYPES:
        return f"key/value dtype {key.dtype}/{value.dtype} not in fp32, bf16, fp16"
    if cache_dtype not in CACHE_DTYPES:
        return f"cache dtype {cache_dtype} not in fp32, bf16, fp16, fp8"
    if slot_mapping.shape != (key.shape[0],):
        return f"slot_mapping {tuple(slot_mapping.shape)} must be [{key.shape[0]}]"
    return scale_problem(params.k_scale, params.v_scale, view.num_kv_heads)


def supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
              slot_mapping: torch.Tensor, params: PagedAttentionParams) -> str | None:
    """Why this kernel cannot serve the call, or None."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return f"kv_cache must be [2, num_blocks, block_size, Hkv, D], got {tuple(kv_cache.shape)}"
    if kv_cache.stride(-1) != 1:
        return "kv_cache needs a unit stride in its last dimension"
    return check_write(key, value, nhd_view(kv_cache), kv_cache.dtype, slot_mapping, params)


@checked(supported)
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, params: PagedAttentionParams) -> None:
    """The ``reshape_and_cache`` op (see the module docstring)."""
    write(key, value, nhd_view(kv_cache), slot_mapping, params)


def write(key: torch.Tensor, value: torch.Tensor, view: CacheView, slot_mapping: torch.Tensor,
          params: PagedAttentionParams) -> None:
    """Store ``key``/``value [T, Hkv, D]`` at ``slot_mapping`` into the cache ``view``
    (checked by :func:`check_write`)."""
    num_tokens, num_heads, head_size = key.shape
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    scales = head_scales(params.k_scale, params.v_scale, num_heads)
    config = launch_config("reshape_and_cache", key.device, head_size)
    block_d = triton.next_power_of_2(head_size)
    keys, values = view.keys, view.values
    _cache_kernel[(num_tokens,)](
        key, value, slot_mapping, num_heads, key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), *(scales or (key, key)),
        *keys.pointer_and_strides(), *values.pointer_and_strides(),
        K_CHUNK=keys.chunk, V_CHUNK=values.chunk, SCALED=scales is not None,
        **fp8_format(keys.tensor.dtype), BLOCK_SIZE=view.block_size,
        HEAD_SIZE=head_size, BLOCK_D=block_d, BLOCK_HEADS=max(1, config["tile"] // block_d),
        num_warps=config["num_warps"])


@triton.jit
def _cache_kernel(key_ptr, value_ptr, slot_mapping_ptr, num_heads,
                  key_stride_t, key_stride_h, value_stride_t, value_stride_h,
                  k_scale_ptr, v_scale_ptr,
                  k_ptr, k_block, k_slot, k_head, k_chunk_stride,
                  v_ptr, v_block, v_slot, v_head, v_chunk_stride,
                  K_CHUNK: tl.constexpr, V_CHUNK: tl.constexpr, SCALED: tl.constexpr,
                  FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr, FP8_STEP: tl.constexpr,
                  FP8_SIGNED_ZERO: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_SIZE: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_HEADS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    dims = tl.arange(0, BLOCK_D)
    k_dims = chunked(dims, K_CHUNK, k_chunk_stride)
    v_dims = chunked(dims, V_CHUNK, v_chunk_stride)
    for head_start in range(0, num_heads, BLOCK_HEADS):
        heads = head_start + tl.arange(0, BLOCK_HEADS)
        mask = (heads[:, None] < num_heads) & (dims[None, :] < HEAD_SIZE)
        store_entries(key_ptr + token * key_stride_t + heads[:, None] * key_stride_h
                      + dims[None, :],
                      k_ptr + block * k_block + offset * k_slot + heads[:, None] * k_head
                      + k_dims[None, :], k_scale_ptr + heads, mask, heads < num_heads, SCALED,
                      FP8_MAX, FP8_MANTISSA, FP8_STEP, FP8_SIGNED_ZERO)
        store_entries(value_ptr + token * value_stride_t + heads[:, None] * value_stride_h
                      + dims[None, :],
                      v_ptr + block * v_block + offset * v_slot + heads[:, None] * v_head
                      + v_dims[None, :], v_scale_ptr + heads, mask, heads < num_heads, SCALED,
                      FP8_MAX, FP8_MANTISSA, FP8_STEP, FP8_SIGNED_ZERO)


@triton.jit
def store_entries(source, target, scale_ptr, mask, head_mask, SCALED: tl.constexpr,
                  FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr, FP8_STEP: tl.constexpr,
                  FP8_SIGNED_ZERO: tl.constexpr):
    """Store the ``[BLOCK_HEADS, BLOCK_D]`` entries at ``source`` into ``target`` (a cache
    entry's heads; the MLA cache write passes its one latent "head"): divided by the
    heads' scales when ``SCALED`` (correctly rounded, as torch divides); into an fp8 cache
    (``FP8_MAX`` not 0) clamped to +-``FP8_MAX`` and rounded to nearest-even."""
    entries = tl.load(source, mask=mask)
    if SCALED:
        # a GPU's default fp32 division is approximate: one ulp off flips fp8 roundings
        entries = tl.math.div_rn(entries.to(tl.float32),
                                 tl.load(scale_ptr, mask=head_mask, other=1.0)[:, None])
    if FP8_MAX != 0.0:
        entries = tl.minimum(tl.maximum(entries.to(tl.float32), -FP8_MAX), FP8_MAX)
        entries = round_to_fp8_grid(entries, FP8_MANTISSA, FP8_STEP, FP8_SIGNED_ZERO)
    tl.store(target, entries.to(target.dtype.element_ty), mask=mask)
