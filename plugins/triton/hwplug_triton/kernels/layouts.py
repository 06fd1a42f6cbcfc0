"""Where a paged KV cache keeps each entry, as the cache-write and attention kernels read it,
and the k/v scales of quantized (fp8) caches.

Entry (block ``b``, slot ``s``, KV head ``h``, dimension ``d``) of one half (keys or
values) lies at element ``b * block + s * slot + h * head + (d // chunk) * chunk_stride
+ d % chunk`` of that half's tensor. ``chunk`` is a compile-time constant of the kernels:

========================  =====  ===========  =====  ==========  ============
half                      chunk  chunk_stride  slot   head        block
========================  =====  ===========  =====  ==========  ============
NHD keys and values       1      1             Hkv*D  D           bs*Hkv*D
========================  =====  ===========  =====  ==========  ============

(NHD strides are the tensor's own, so views work.) A plugin whose layout keeps entries
elsewhere builds its own :class:`CacheView` (a chunked one: keys split into chunks of
``chunk`` elements, ``chunk_stride`` apart) and calls the generic
:func:`~hwplug_triton.kernels.cache.write` and :func:`~hwplug_triton.kernels.attention.attend`
on it, as hwplug-rocm-aiter does for ROCm's paged layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Cache dtypes the kernels accept: the compute dtypes and fp8 (OCP and fnuz flavours).
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
#: Compute (query, key, value) dtypes the kernels accept.
COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Half:
    """The keys or the values of one cache: the tensor and its entry strides."""

    tensor: torch.Tensor
    block: int
    slot: int
    head: int
    chunk_stride: int
    chunk: int

    def pointer_and_strides(self) -> tuple[torch.Tensor, int, int, int, int]:
        """The kernels' runtime arguments for this half (``chunk`` is passed apart, as a
        compile-time constant)."""
        return self.tensor, self.block, self.slot, self.head, self.chunk_stride


@dataclass(frozen=True)
class CacheView:
    """A paged KV cache as the kernels address it, whatever its layout."""

    keys: Half
    values: Half
    block_size: int
    num_kv_heads: int
    head_size: int


def nhd_view(kv_cache: torch.Tensor) -> CacheView:
    """``kv_cache [2, num_blocks, block_size, Hkv, D]`` (needs a unit last stride)."""
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    halves = [Half(kv_cache[i], kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
                   kv_cache.stride(4), 1) for i in (0, 1)]
    return CacheView(*halves, block_size, num_kv_heads, head_size)


def scale_problem(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                  num_kv_heads: int) -> str | None:
    """Why the k/v scales cannot be read, or None: each must be None or a float tensor of
    one element (per tensor) or ``Hkv`` elements (per KV head)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            continue
        if not scale.is_floating_point() or scale.numel() not in (1, num_kv_heads):
            return f"{name} must be a float tensor of 1 or {num_kv_heads} elements, got " \
                   f"{scale.dtype} {tuple(scale.shape)}"
    return None


def head_scales(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The scales as contiguous float32 ``[Hkv]`` tensors (a missing one is 1), or None
    when neither is given."""
    if k_scale is None and v_scale is None:
        return None
    given = k_scale if k_scale is not None else v_scale
    return tuple(  # type: ignore[return-value]
        (scale if scale is not None else torch.ones_like(given)).to(torch.float32)
        .reshape(-1).expand(num_kv_heads).contiguous() for scale in (k_scale, v_scale))


#: Mantissa bits of each fp8 cache dtype (``torch.finfo(float8_e5m2fnuz).eps`` says 3).
FP8_MANTISSA_BITS = {torch.float8_e4m3fn: 3, torch.float8_e5m2: 2, torch.float8_e4m3fnuz: 3,
                     torch.float8_e5m2fnuz: 2}


def fp8_format(dtype: torch.dtype) -> dict[str, float | int]:
    """The cache-write kernel's constants for storing into ``dtype``: ``FP8_MAX`` (stores
    clamp to it, as the reference does; 0.0: not fp8), ``FP8_MANTISSA`` and ``FP8_STEP``
    (the subnormal spacing) and ``FP8_SIGNED_ZERO`` of
    :func:`~hwplug_triton.kernels.functions.round_to_fp8_grid`."""
    if dtype not in FP8_MANTISSA_BITS:
        return {"FP8_MAX": 0.0, "FP8_MANTISSA": 0, "FP8_STEP": 0.0, "FP8_SIGNED_ZERO": False}
    info, mantissa = torch.finfo(dtype), FP8_MANTISSA_BITS[dtype]
    return {"FP8_MAX": float(info.max), "FP8_MANTISSA": mantissa,
            "FP8_STEP": float(info.tiny) * 2.0 ** -mantissa,
            "FP8_SIGNED_ZERO": dtype in (torch.float8_e4m3fn, torch.float8_e5m2)}
