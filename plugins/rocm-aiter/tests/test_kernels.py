"""The ``ROCM_PA`` layout and hwplug-triton's kernels over it, against the references.

The layout is checked element by element against its definition (the one ROCm's paged
attention reads) and round-trips ``NHD`` exactly. The cache write and the attention
kernels (hwplug-triton's, through :func:`~hwplug_rocm_aiter.cache_rocm_pa.rocm_pa_view`)
run in Triton's interpreter without a GPU, over a cache converted from the ``NHD`` batch
with the layout's ``from_reference``, and must match the references on the ``NHD`` batch
within the ops' tolerances (fp8 caches with per-tensor and per-head scales included).
The full attention grid is ``slow``; the default run keeps a representative subset.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import (
    BATCHES,
    DTYPES,
    FP8_DTYPES,
    HEADS,
    ON_GPU,
    check_attention,
    kv_scales,
    paged_batch,
    write_both,
)

from hwplug.attention import PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug_rocm_aiter import attention_rocm_pa, cache_rocm_pa
from hwplug_rocm_aiter.layout import ROCM_PA, key_view

#: (tokens, blocks, KV heads, head size) of the cache writes.
SHAPE = (2000, 300, 8, 128) if ON_GPU else (20, 6, 2, 48)
ATTEND = attention_rocm_pa.paged_attention


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES[1:], torch.float8_e4m3fn], ids=str)
def test_the_layout_is_the_one_rocm_reads(dtype: torch.dtype) -> None:
    """K at [block, head, d // x, slot, d % x] with x = 16 bytes / element size, V at
    [block, head, d, slot]; to_reference / from_reference invert each other exactly."""
    num_blocks, block_size, num_kv_heads, head_size = 3, 16, 2, 64
    nhd = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size).to(dtype)
    cache = torch.empty(ROCM_PA.shape(num_blocks, block_size, num_kv_heads, head_size),
                        dtype=dtype)
    ROCM_PA.from_reference(nhd, cache)
    x = 16 // dtype.itemsize
    keys = key_view(cache)
    assert keys.shape == (num_blocks, num_kv_heads, head_size // x, block_size, x)
    gen = torch.Generator().manual_seed(0)
    for block, slot, head, dim in torch.stack([torch.randint(0, n, (50,), generator=gen) for n in
                                               (num_blocks, block_size, num_kv_heads,
                                                head_size)], 1).tolist():
        assert keys[block, head, dim // x, slot, dim % x].float() == nhd[0, block, slot, head,
                                                                         dim].float()
        assert cache[1, block, head, dim, slot].float() == nhd[1, block, slot, head, dim].float()
    assert torch.equal(ROCM_PA.to_reference(cache).float(), nhd.float())


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("kv_dtype", "cache_dtype"), [
    (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16), (torch.bfloat16, torch.float32)], ids=str)
def test_float_cache_writes(device: str, kv_dtype: torch.dtype, cache_dtype: torch.dtype,
                            block_size: int) -> None:
    written, expected = write_both(cache_rocm_pa.reshape_and_cache, ROCM_PA, SHAPE, kv_dtype,
                                   cache_dtype, block_size, device)
    assert torch.equal(written, expected)


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_fp8_cache_writes_hold_the_reference_codes(device: str, cache_dtype: torch.dtype,
                                                   per_head: bool) -> None:
    scales = kv_scales(cache_dtype, SHAPE[2], per_head, device)
    written, expected = write_both(cache_rocm_pa.reshape_and_cache, ROCM_PA, SHAPE,
                                   torch.bfloat16, cache_dtype, 16, device, scales)
    assert torch.equal(written.float(), expected.float())  # equal values (+0 / -0 alike)


def test_a_head_size_that_is_not_whole_chunks_is_declined() -> None:
    key = torch.empty(2, 1, 24, device="meta")
    bad = torch.empty(ROCM_PA.shape(2, 16, 1, 24), dtype=torch.float8_e4m3fn,
                      device="meta")  # x = 16 for fp8: 24 is not a multiple
    slots = torch.zeros(2, dtype=torch.long, device="meta")
    params = PagedAttentionParams(1.0, layout=ROCM_PA)
    assert "not a multiple of x = 16" in cache_rocm_pa.supported(key, key, bad, slots, params)
    with pytest.raises(UnsupportedError, match="not a multiple"):
        cache_rocm_pa.reshape_and_cache(key, key, bad, slots, params)


@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_attention(device: str, dtype: torch.dtype, kind: str) -> None:
    """Every kind of batch, GQA, two values of x (4 for fp32, 8 for fp16), a sliding
    window and a soft cap on the mixed batch."""
    batch = paged_batch(*BATCHES[kind], HEADS[1], 16, dtype, device)
    extra = {"sliding_window": 7, "soft_cap": 5.0} if kind == "mixed" else {}
    check_attention(ATTEND, batch, ROCM_PA, **extra)


@pytest.mark.slow
@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("window", "soft_cap"), [(None, None), (7, 5.0)])
def test_attention_grid(device: str, dtype: torch.dtype, kind: str, block_size: int,
                        heads: tuple[int, int, int], window: int | None,
                        soft_cap: float | None) -> None:
    batch = paged_batch(*BATCHES[kind], heads, block_size, dtype, device)
    check_attention(ATTEND, batch, ROCM_PA, sliding_window=window, soft_cap=soft_cap)


@pytest.mark.parametrize(("kind", "dtype", "kv_dtype", "per_head"), [
    ("decode", torch.float32, FP8_DTYPES[2], False),
    ("mixed", torch.float16, FP8_DTYPES[0], True),
    ("decode", torch.bfloat16, FP8_DTYPES[1], True),
], ids=str)
def test_fp8_caches_are_read_with_their_scales(device: str, kind: str, dtype: torch.dtype,
                                               kv_dtype: torch.dtype, per_head: bool) -> None:
    batch = paged_batch(*BATCHES[kind], HEADS[1], 16, dtype, device, kv_dtype=kv_dtype)
    check_attention(ATTEND, batch, ROCM_PA, **kv_scales(kv_dtype, HEADS[1][1], per_head, device))
