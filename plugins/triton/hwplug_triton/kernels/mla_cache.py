"""``concat_and_cache_mla``: write a step's latents into the ``MLA`` cache
``[num_blocks, block_size, L + R]`` with Triton.

Contract (the op of :mod:`hwplug.kernel_registry.ops_mla`): token ``t``'s ``[kv_c[t],
k_pe[t]]`` goes to block ``s // block_size``, offset ``s % block_size`` for ``s =
slot_mapping[t] >= 0`` (a negative slot is skipped), divided by ``kv_scale`` when given,
clamped to the largest finite value of an fp8 cache and rounded to nearest-even, cast to
the cache dtype. One program per token, in place, no host synchronisation; the stores
are :func:`~hwplug_triton.kernels.cache.store_entries`, ``reshape_and_cache``'s.

supports: kv_c / k_pe fp32, bf16 or fp16 (any strides with a unit last one); caches in
those or fp8 (OCP and fnuz) with a one-element ``kv_scale``; ``L`` up to
:data:`MAX_LATENT`, ``R`` up to 256; see :func:`supported` (:func:`cache_problem` is the
cache's part, which :mod:`.mla` shares).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hwplug_triton.kernels import MAX_HEAD_SIZE, checked
from hwplug_triton.kernels.cache import store_entries
from hwplug_triton.kernels.layouts import CACHE_DTYPES, COMPUTE_DTYPES, fp8_format
from hwplug_triton.tuning import launch_config

#: Largest latent width ``L`` the kernels serve (the attention kernel holds a query and a key
#: tile of it in registers; DeepSeek: 512).
MAX_LATENT = 1024


def cache_problem(kv_cache: torch.Tensor, latent: int, rope: int,
                  kv_scale: torch.Tensor | None) -> str | None:
    """Why the kernels cannot address ``kv_cache`` as an MLA cache of ``latent + rope``
    columns with ``kv_scale``, or None."""
    if kv_cache.dim() != 3 or kv_cache.shape[2] != latent + rope:
        return f"kv_cache must be [num_blocks, block_size, {latent} + {rope}], got " \
               f"{tuple(kv_cache.shape)}"
    if kv_cache.dtype not in CACHE_DTYPES:
        return f"kv_cache dtype {kv_cache.dtype} not in fp32, bf16, fp16, fp8"
    if kv_cache.stride(-1) != 1:
        return "kv_cache needs a unit stride in its last dimension"
    if latent > MAX_LATENT or rope > MAX_HEAD_SIZE:
        return f"latent {latent} and rope {rope} must be <= {MAX_LATENT} and {MAX_HEAD_SIZE}"
    if kv_scale is not None and (not kv_scale.is_floating_point() or kv_scale.numel() != 1):
        return f"kv_scale must be a float tensor of one element, got {kv_scale.dtype} " \
               f"{tuple(kv_scale.shape)}"
    return None


def supported(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None
                    ) -> str | None:
    """Why :func:`concat_and_cache_mla` cannot serve the call, or None (no device sync)."""
    if kv_c.dim() != 2 or k_pe.dim() != 2 or kv_c.shape[0] != k_pe.shape[0]:
        return f"expected kv_c [T, L] and k_pe [T, R], got {tuple(kv_c.shape)} and " \
               f"{tuple(k_pe.shape)}"
    if kv_c.dtype not in COMPUTE_DTYPES or k_pe.dtype not in COMPUTE_DTYPES:
        return f"kv_c/k_pe dtype {kv_c.dtype}/{k_pe.dtype} not in fp32, bf16, fp16"
    if slot_mapping.shape != (kv_c.shape[0],):
        return f"slot_mapping {tuple(slot_mapping.shape)} must be [{kv_c.shape[0]}]"
    return cache_problem(kv_cache, kv_c.shape[1], k_pe.shape[1], kv_scale)


@checked(supported)
def concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                         slot_mapping: torch.Tensor, kv_scale: torch.Tensor | None = None
                         ) -> None:
    """The ``concat_and_cache_mla`` op: one program per token writes ``[kv_c, k_pe]`` at
    its slot (a negative slot is skipped), in place, no host synchronisation."""
    num_tokens, latent = kv_c.shape
    if num_tokens == 0:
        return
    kv_c = kv_c if kv_c.stride(-1) == 1 else kv_c.contiguous()
    k_pe = k_pe if k_pe.stride(-1) == 1 else k_pe.contiguous()
    scale = kv_scale.to(torch.float32).reshape(1) if kv_scale is not None else None
    config = launch_config("reshape_and_cache", kv_c.device, kv_cache.shape[2])
    _cache_kernel[(num_tokens,)](
        kv_c, k_pe, slot_mapping, scale if scale is not None else kv_c, kv_cache,
        kv_c.stride(0), k_pe.stride(0), kv_cache.stride(0), kv_cache.stride(1),
        SCALED=scale is not None, **fp8_format(kv_cache.dtype),
        BLOCK_SIZE=kv_cache.shape[1], LATENT=latent, ROPE=k_pe.shape[1],
        BLOCK_L=triton.next_power_of_2(latent), BLOCK_R=triton.next_power_of_2(k_pe.shape[1]),
        num_warps=config["num_warps"])


@triton.jit
def _cache_kernel(kv_c_ptr, k_pe_ptr, slot_mapping_ptr, scale_ptr, cache_ptr,
                  kv_c_stride, k_pe_stride, cache_block, cache_slot,
                  SCALED: tl.constexpr, FP8_MAX: tl.constexpr, FP8_MANTISSA: tl.constexpr,
                  FP8_STEP: tl.constexpr, FP8_SIGNED_ZERO: tl.constexpr, BLOCK_SIZE: tl.constexpr, LATENT: tl.constexpr,
                  ROPE: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    entry = cache_ptr + (slot // BLOCK_SIZE) * cache_block + (slot % BLOCK_SIZE) * cache_slot
    one = tl.zeros([1], dtype=tl.int32)  # the one "head" of the latent cache
    lat = tl.arange(0, BLOCK_L)[None, :]
    store_entries(kv_c_ptr + token * kv_c_stride + lat, entry + lat, scale_ptr + one,
                  lat < LATENT, one == 0, SCALED, FP8_MAX, FP8_MANTISSA, FP8_STEP,
                  FP8_SIGNED_ZERO)
    pe = tl.arange(0, BLOCK_R)[None, :]
    store_entries(k_pe_ptr + token * k_pe_stride + pe, entry + LATENT + pe, scale_ptr + one,
                  pe < ROPE, one == 0, SCALED, FP8_MAX, FP8_MANTISSA, FP8_STEP,
                  FP8_SIGNED_ZERO)
