"""hwplug-triton's cache writes (layouts NHD and ROCM_PA) against the reference ops.

Float caches must come out bit-identical to the reference's where no rounding happens
(the cache dtype holds the key dtype), else within the op's tolerance; fp8 caches with
per-tensor or per-head scales must hold exactly the reference's codes (the kernel rounds
to nearest-even itself, see ``round_to_fp8_grid``). The ROCM_PA layout is also checked
against its definition element by element, and its conversions round-trip NHD exactly.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import DTYPES, FP8_DTYPES, ON_GPU, kv_scales, random

from hwplug.attention import PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import reference
from hwplug.kernel_registry.reference import rocm_pa
from hwplug_triton.kernels import cache, cache_rocm_pa

CACHE_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                (torch.float32, torch.bfloat16)]
#: (tokens, blocks, KV heads, head size)
SHAPE = (2000, 300, 8, 128) if ON_GPU else (20, 6, 2, 48)


def write_both(layout: str, kv_dtype: torch.dtype, cache_dtype: torch.dtype, block_size: int,
               device: str, scales: dict[str, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache after the kernel's write and after the reference's, from the same start:
    strided key/value views, a quarter of the tokens padding (slot -1)."""
    num_tokens, num_blocks, num_kv_heads, head_size = SHAPE
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1
    slots = slots.to(device)
    kv = random(num_tokens, 2, num_kv_heads, head_size, dtype=kv_dtype, device=device)
    key, value = kv[:, 0], kv[:, 1]
    nhd = random(2, num_blocks, block_size, num_kv_heads, head_size, dtype=cache_dtype,
                 device=device, seed=1)
    if layout == "ROCM_PA":
        start = nhd.new_empty(rocm_pa.cache_shape(num_blocks, block_size, num_kv_heads,
                                                  head_size))
        rocm_pa.from_nhd(nhd, start)
        kernel, oracle = cache_rocm_pa.reshape_and_cache_rocm_pa, \
            rocm_pa.reshape_and_cache_rocm_pa
    else:
        start, kernel, oracle = nhd, cache.reshape_and_cache, reference.reshape_and_cache
    written, expected = start.clone(), start.clone()
    params = PagedAttentionParams(1.0, **(scales or {}))
    kernel(key, value, written, slots, params)
    oracle(key, value, expected, slots, params)
    return written, expected


@pytest.mark.parametrize("layout", ["NHD", "ROCM_PA"])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("kv_dtype", "cache_dtype"), CACHE_DTYPES, ids=str)
def test_float_caches(device: str, layout: str, kv_dtype: torch.dtype,
                      cache_dtype: torch.dtype, block_size: int) -> None:
    written, expected = write_both(layout, kv_dtype, cache_dtype, block_size, device)
    if cache_dtype.itemsize >= kv_dtype.itemsize:  # exact copies
        assert torch.equal(written, expected)
    else:  # the interpreter truncates fp32 -> bf16: within one ulp
        torch.testing.assert_close(written, expected, atol=0, rtol=2 ** -7)


@pytest.mark.parametrize("layout", ["NHD", "ROCM_PA"])
@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_fp8_caches_hold_the_reference_codes(device: str, layout: str,
                                             cache_dtype: torch.dtype, per_head: bool) -> None:
    scales = kv_scales(cache_dtype, SHAPE[2], per_head, device)
    written, expected = write_both(layout, torch.bfloat16, cache_dtype, 16, device, scales)
    assert torch.equal(written.float(), expected.float())  # equal values (+0 / -0 alike)


def test_fp8_writes_saturate_instead_of_overflowing(device: str) -> None:
    """Values beyond the format's range are stored as its largest finite value; the rest
    round to nearest (-250 -> -256: e4m3 is 16 apart there)."""
    key = torch.tensor([[[1e6, -1e6, 3.0, -500.0]]], device=device)
    kv_cache = torch.zeros(2, 1, 1, 1, 4, dtype=torch.float8_e4m3fn, device=device)
    cache.reshape_and_cache(key, key, kv_cache, torch.zeros(1, dtype=torch.long, device=device),
                            PagedAttentionParams(1.0, k_scale=torch.tensor(1.0, device=device),
                                                 v_scale=torch.tensor(2.0, device=device)))
    assert kv_cache[0].flatten().float().tolist() == [448.0, -448.0, 3.0, -448.0]
    assert kv_cache[1].flatten().float().tolist() == [448.0, -448.0, 1.5, -256.0]


@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES[1:], torch.float8_e4m3fn], ids=str)
def test_rocm_pa_layout_is_the_one_rocm_reads(dtype: torch.dtype) -> None:
    """K at [block, head, d // x, slot, d % x] with x = 16 bytes / element size, V at
    [block, head, d, slot]; to_nhd / from_nhd invert each other exactly."""
    num_blocks, block_size, num_kv_heads, head_size = 3, 16, 2, 64
    nhd = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size).to(dtype)
    cache_ = torch.empty(rocm_pa.cache_shape(num_blocks, block_size, num_kv_heads, head_size),
                         dtype=dtype)
    rocm_pa.from_nhd(nhd, cache_)
    x = 16 // dtype.itemsize
    keys = rocm_pa.key_view(cache_)
    assert keys.shape == (num_blocks, num_kv_heads, head_size // x, block_size, x)
    gen = torch.Generator().manual_seed(0)
    for block, slot, head, dim in torch.stack([torch.randint(0, n, (50,), generator=gen) for n in
                                               (num_blocks, block_size, num_kv_heads,
                                                head_size)], 1).tolist():
        assert keys[block, head, dim // x, slot, dim % x].float() == nhd[0, block, slot, head,
                                                                         dim].float()
        assert cache_[1, block, head, dim, slot].float() == nhd[1, block, slot, head, dim].float()
    assert torch.equal(rocm_pa.to_nhd(cache_).float(), nhd.float())


def test_rocm_pa_write_rejects_a_head_size_that_is_not_whole_chunks() -> None:
    key = torch.empty(2, 1, 24, device="meta")
    bad = torch.empty(rocm_pa.cache_shape(2, 16, 1, 24), dtype=torch.float8_e4m3fn,
                      device="meta")  # x = 16 for fp8: 24 is not a multiple
    slots = torch.zeros(2, dtype=torch.long, device="meta")
    params = PagedAttentionParams(1.0)
    assert "not a multiple of x = 16" in cache_rocm_pa.supported(key, key, bad, slots, params)
    with pytest.raises(UnsupportedError, match="not a multiple"):
        cache_rocm_pa.reshape_and_cache_rocm_pa(key, key, bad, slots, params)


@pytest.mark.parametrize(("change", "reason"), [
    ({"key": torch.empty(3, 2, 64, dtype=torch.float8_e4m3fn)}, "key/value dtype"),
    ({"params": PagedAttentionParams(1.0, k_scale=torch.ones(3))},
     "k_scale must be a float tensor of 1 or 2 elements"),
    ({"slot_mapping": torch.zeros(4, dtype=torch.long)}, "slot_mapping"),
])
def test_cache_write_rejects_what_it_cannot_serve(change: dict, reason: str) -> None:
    call = {"key": torch.empty(3, 2, 64), "value": torch.empty(3, 2, 64),
            "kv_cache": torch.empty(2, 4, 16, 2, 64), "slot_mapping": torch.zeros(3,
                                                                                 dtype=torch.long),
            "params": PagedAttentionParams(1.0)}
    call.update(change)
    call = {name: value.to("meta") if isinstance(value, torch.Tensor) else value
            for name, value in call.items()}
    assert reason in cache.supported(**call)
    with pytest.raises(UnsupportedError, match=reason.split()[0]):
        cache.reshape_and_cache(**call)
