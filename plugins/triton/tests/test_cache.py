"""hwplug-triton's cache write (layout NHD) against the reference op.

Float caches must come out bit-identical to the reference's where no rounding happens
(the cache dtype holds the key dtype), else within the op's tolerance; fp8 caches with
per-tensor or per-head scales must hold exactly the reference's codes (the kernel rounds
to nearest-even itself, see ``round_to_fp8_grid``). (The same kernel over ROCm's layout
is tested with hwplug-rocm-aiter.)
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import FNUZ, FP8_DTYPES, ON_GPU, kv_scales, skip_fp8_the_gpu_lacks, write_both

from hwplug.attention import PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import reference
from hwplug.kv_cache_layout import NHD
from hwplug_triton.kernels import cache

CACHE_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                (torch.float32, torch.bfloat16)]
#: (tokens, blocks, KV heads, head size)
SHAPE = (2000, 300, 8, 128) if ON_GPU else (20, 6, 2, 48)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("kv_dtype", "cache_dtype"), CACHE_DTYPES, ids=str)
def test_float_caches(device: str, kv_dtype: torch.dtype, cache_dtype: torch.dtype,
                      block_size: int) -> None:
    written, expected = write_both(cache.reshape_and_cache, NHD, SHAPE, kv_dtype, cache_dtype,
                                   block_size, device)
    if cache_dtype.itemsize >= kv_dtype.itemsize:  # exact copies
        assert torch.equal(written, expected)
    else:  # the interpreter truncates fp32 -> bf16: within one ulp
        torch.testing.assert_close(written, expected, atol=0, rtol=2 ** -7)


@pytest.mark.parametrize("per_head", [False, True], ids=["per_tensor", "per_head"])
@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_fp8_caches_hold_the_reference_codes(device: str, cache_dtype: torch.dtype,
                                             per_head: bool) -> None:
    skip_fp8_the_gpu_lacks(cache_dtype)
    scales = kv_scales(cache_dtype, SHAPE[2], per_head, device)
    written, expected = write_both(cache.reshape_and_cache, NHD, SHAPE, torch.bfloat16,
                                   cache_dtype, 16, device, scales)
    # the same bytes: values that round to zero keep their sign, as torch's cast
    assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
def test_fp8_writes_keep_the_sign_of_values_that_round_to_zero(device: str,
                                                               cache_dtype: torch.dtype) -> None:
    """-0.0 and tiny negatives are stored as fp8's negative zero, as torch's cast stores
    them (the reference's), not as +0; the fnuz formats have none (their 0x80 is NaN)."""
    skip_fp8_the_gpu_lacks(cache_dtype)
    key = torch.tensor([[[-0.0, -1e-9, 1e-9, 0.0, -1e-30, 3.0, -2.0 ** -20, 1.0]]],
                       device=device)
    slot = torch.zeros(1, dtype=torch.long, device=device)
    params = PagedAttentionParams(1.0, k_scale=torch.tensor(1.0, device=device),
                                  v_scale=torch.tensor(1.0, device=device))
    written, expected = (torch.zeros(2, 1, 1, 1, 8, dtype=cache_dtype, device=device)
                         for _ in range(2))
    cache.reshape_and_cache(key, key, written, slot, params)
    reference.reshape_and_cache(key, key, expected, slot, params)
    assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
    negative_zero = written[0].flatten().view(torch.uint8)[1].item()
    assert negative_zero == (0 if cache_dtype in FNUZ else 0x80)


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
