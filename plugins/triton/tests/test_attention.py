"""hwplug-triton's paged attention (layout NHD) against the reference op.

Decode, prefill, chunked prefill, speculative verify (k + 1 queries per decoding
sequence) and mixed batches over shuffled block tables, GQA and head sizes that are not
powers of two, sliding windows, soft caps, non-causal attention,
the split-KV decode path, and fp8 caches read with per-tensor or per-head scales. Every
output must match ``reference.paged_attention`` within the op's tolerance. (The same
kernels over ROCm's layout are tested with hwplug-rocm-aiter.)
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
    PagedBatch,
    assert_matches,
    kv_scales,
    paged_batch,
    skip_fp8_the_gpu_lacks,
)
from triton_cases import check_attention as check_kernel

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import reference
from hwplug_triton import tuning
from hwplug_triton.kernels import attention
from hwplug_triton.kernels.decode_attention import decode_attention, split_plan
from hwplug_triton.kernels.layouts import head_scales, nhd_view


def check_attention(batch: PagedBatch, **options: object) -> None:
    """The NHD kernel on ``batch`` matches the reference."""
    check_kernel(attention.paged_attention, batch, **options)


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention(device: str, dtype: torch.dtype, kind: str, block_size: int,
                         heads: tuple[int, int, int]) -> None:
    check_attention(paged_batch(*BATCHES[kind], heads, block_size, dtype, device))


@pytest.mark.parametrize(("window", "soft_cap"), [(7, None), (None, 5.0), (7, 5.0)])
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paged_attention_window_and_soft_cap(device: str, dtype: torch.dtype, kind: str,
                                             window: int | None,
                                             soft_cap: float | None) -> None:
    batch = paged_batch(*BATCHES[kind], HEADS[1], 16, dtype, device)
    check_attention(batch, sliding_window=window, soft_cap=soft_cap)


#: (batch, query dtype, fp8 cache dtype, per-head scales): each value at least once.
FP8_CASES = [
    ("decode", torch.float16, FP8_DTYPES[0], True),
    ("mixed", torch.float32, FP8_DTYPES[1], False),
    ("mixed", torch.float16, FP8_DTYPES[2], True),
]


@pytest.mark.parametrize(("kind", "dtype", "kv_dtype", "per_head"), FP8_CASES, ids=str)
def test_fp8_caches_are_read_with_their_scales(device: str, kind: str, dtype: torch.dtype,
                                               kv_dtype: torch.dtype, per_head: bool) -> None:
    skip_fp8_the_gpu_lacks(kv_dtype)
    batch = paged_batch(*BATCHES[kind], HEADS[1], 16, dtype, device, kv_dtype=kv_dtype)
    check_attention(batch, **kv_scales(kv_dtype, HEADS[1][1], per_head, device))


@pytest.mark.parametrize("kind", BATCHES)
def test_paged_attention_non_causal(device: str, kind: str) -> None:
    check_attention(paged_batch(*BATCHES[kind], HEADS[1], 32, torch.float32, device),
                    causal=False)


@pytest.mark.parametrize(("window", "soft_cap"), [(None, None), (20, None), (None, 5.0)])
def test_decode_split_kv(device: str, window: int | None, soft_cap: float | None) -> None:
    """A split size smaller than the contexts: partials per split, merged by the reduce
    kernel; with a window, the splits before it are empty; with fp8 scales (on the soft
    cap case), each partial carries its value scale."""
    batch = paged_batch(*BATCHES["decode"], HEADS[1], 16, torch.float32, device)
    config = tuning.launch_config("paged_attention_decode", batch.query.device,
                                   batch.max_seq_len)
    split_size = 2 * config["block_n"]
    assert split_plan(1, batch.max_seq_len, config, batch.query.device, split_size)[1] > 1
    scales = kv_scales(torch.float8_e4m3fn, HEADS[1][1], True, device) if soft_cap else {}
    batch.kv_cache = batch.kv_cache.to(torch.float8_e4m3fn) if scales else batch.kv_cache
    params = PagedAttentionParams(0.3, sliding_window=window, soft_cap=soft_cap, **scales)
    out = decode_attention(batch.query, nhd_view(batch.kv_cache), batch.metadata(), params,
                           head_scales(*scales.values(), HEADS[1][1]) if scales else None,
                           split_size)
    assert_matches("paged_attention", out,
                   reference.paged_attention(batch.query, batch.kv_cache, batch.metadata(),
                                             params))


def test_decode_splits_long_contexts_on_its_own(device: str) -> None:
    """Few (sequence, KV head) pairs over a long context: the tuned plan splits it."""
    seq_len, heads = (8000, HEADS[0]) if ON_GPU else (600, (2, 1, 32))
    batch = paged_batch([1], [seq_len], heads, 16, torch.bfloat16, device)
    config = tuning.launch_config("paged_attention_decode", batch.query.device, seq_len)
    assert split_plan(heads[1], seq_len, config, batch.query.device)[1] > 1
    check_attention(batch)


@pytest.mark.parametrize(("change", "reason"), [
    ({"query": torch.empty(3, 8, 64, dtype=torch.float64)}, "dtype"),
    ({"kv_cache": torch.empty(2, 4, 16, 2, 64, dtype=torch.int8)}, "kv_cache dtype"),
    ({"params": PagedAttentionParams(1.0, k_scale=torch.ones(3), v_scale=torch.ones(()))},
     "k_scale must be"),
    ({"query": torch.empty(3, 3, 64)}, "multiple of KV heads"),
    ({"query": torch.empty(3, 8, 512), "kv_cache": torch.empty(2, 4, 16, 2, 512)},
     "head size"),
    ({"metadata": AttentionMetadata(*[torch.zeros(n, dtype=torch.int32) for n in (3, 3, 3, 3)],
                                    1, 1)}, "block_tables"),
])
def test_paged_attention_rejects_what_it_cannot_serve(change: dict, reason: str) -> None:
    call = {"query": torch.empty(3, 8, 64), "kv_cache": torch.empty(2, 4, 16, 2, 64),
            "metadata": AttentionMetadata(torch.zeros(3, dtype=torch.int64),
                                          torch.zeros(3, 2, dtype=torch.int32),
                                          torch.ones(3, dtype=torch.int32),
                                          torch.arange(4, dtype=torch.int32), 1, 1),
            "params": PagedAttentionParams(1.0)}
    call.update({name: value.to("meta") if isinstance(value, torch.Tensor) else value
                 for name, value in change.items()})
    assert reason in attention.supported(**call)
    with pytest.raises(UnsupportedError, match=reason):
        attention.paged_attention(**call)
