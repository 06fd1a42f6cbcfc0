"""The reference ``paged_attention`` against dense attention over contiguous K/V.

Each case builds per-sequence contiguous keys/values, scatters them into a paged cache
through shuffled block tables, and compares the paged result with fp64
``scaled_dot_product_attention`` (or an explicit fp64 softmax when soft-capping) run
sequence by sequence on the contiguous copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.kernel_registry.reference import attention, paged_attention

#: (atol, rtol) of the reference against the fp64 oracle. fp32 accumulates in fp32;
#: half-precision inputs are exact in fp64, so their error is the rounding of the output:
#: allow two ulps (2 * 2**-8 for bf16, 2 * 2**-11 for fp16).
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (8e-3, 8e-3),
              torch.float16: (1e-3, 1e-3)}
#: A _TILE_BYTES this small gives one KV block per tile: the online softmax then merges
#: as many tiles as a sequence has blocks.
ONE_BLOCK_TILES = 1


@dataclass
class Batch:
    query: torch.Tensor  # [T, Hq, D], packed
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    keys: list[torch.Tensor]  # per sequence [seq_len, Hkv, D], contiguous
    values: list[torch.Tensor]


def make_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int,
               head_size: int, block_size: int, dtype: torch.dtype, seed: int) -> Batch:
    """Random K/V per sequence, stored in shuffled blocks of a larger cache whose other
    slots hold large garbage; unused table entries are -1 or some other block."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    max_blocks = max(blocks_needed) + 1
    num_blocks = sum(blocks_needed) + 3
    kv_cache = 100 * torch.randn(2, num_blocks, block_size, num_kv_heads, head_size,
                                 generator=gen, dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.randint(-1, num_blocks, (len(seq_lens), max_blocks), generator=gen,
                                 dtype=torch.int32)
    keys, values, used = [], [], 0
    for i, (seq_len, n) in enumerate(zip(seq_lens, blocks_needed, strict=True)):
        block_tables[i, :n] = order[used:used + n].int()
        used += n
        key, value = torch.randn(2, seq_len, num_kv_heads, head_size, generator=gen, dtype=dtype)
        k = torch.arange(seq_len)
        blocks = block_tables[i, k // block_size].long()
        kv_cache[0, blocks, k % block_size] = key
        kv_cache[1, blocks, k % block_size] = value
        keys.append(key)
        values.append(value)
    query = torch.randn(sum(query_lens), num_heads, head_size, generator=gen).to(dtype)
    starts = torch.tensor([0, *query_lens]).cumsum(0).int()
    return Batch(query, kv_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32),
                 starts, keys, values)


def dense_attention(batch: Batch, scale: float, causal: bool, sliding_window: int | None,
                    soft_cap: float | None) -> torch.Tensor:
    """fp64 attention of each sequence's queries over its contiguous K/V."""
    outputs = []
    starts = batch.query_start_loc.tolist()
    for i, (key, value) in enumerate(zip(batch.keys, batch.values, strict=True)):
        q = batch.query[starts[i]:starts[i + 1]].double().transpose(0, 1)  # [Hq, q, D]
        k, v = key.double().transpose(0, 1), value.double().transpose(0, 1)  # [Hkv, L, D]
        positions = torch.arange(k.shape[1] - q.shape[1], k.shape[1])[:, None]
        key_positions = torch.arange(k.shape[1])[None, :]
        mask = key_positions <= positions
        if not causal:
            mask = torch.ones_like(mask)
        if sliding_window is not None:
            mask = mask & (positions - key_positions < sliding_window)
        if soft_cap is None:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                 enable_gqa=True)
        else:
            group = q.shape[0] // k.shape[0]
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            logits = soft_cap * torch.tanh(scale * q @ k.transpose(-1, -2) / soft_cap)
            out = logits.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs)


def metadata(batch: Batch, block_tables: torch.Tensor | None = None) -> AttentionMetadata:
    """The batch's metadata (no slots: the cache is written already)."""
    query_lens = (batch.query_start_loc[1:] - batch.query_start_loc[:-1]).tolist()
    return AttentionMetadata(torch.zeros(0, dtype=torch.int64),
                             batch.block_tables if block_tables is None else block_tables,
                             batch.seq_lens, batch.query_start_loc, max(query_lens),
                             int(batch.seq_lens.max()))


def assert_matches_dense(batch: Batch, scale: float, causal: bool = True,
                         sliding_window: int | None = None,
                         soft_cap: float | None = None) -> None:
    params = PagedAttentionParams(scale, causal, sliding_window, soft_cap)
    out = paged_attention(batch.query, batch.kv_cache, metadata(batch), params)
    expected = dense_attention(batch, scale, causal, sliding_window, soft_cap)
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    atol, rtol = TOLERANCES[batch.query.dtype]
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)


@st.composite
def sequences(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """(seq_lens, query_lens) of 1-4 sequences, each a prefill, chunk or decode."""
    seq_lens, query_lens = [], []
    for _ in range(draw(st.integers(1, 4))):
        seq_len = draw(st.integers(1, 70))
        kind = draw(st.sampled_from(["prefill", "chunk", "decode"]))
        query_len = {"prefill": seq_len, "decode": 1,
                     "chunk": draw(st.integers(1, seq_len))}[kind]
        seq_lens.append(seq_len)
        query_lens.append(query_len)
    return seq_lens, query_lens


@settings(max_examples=120, deadline=None)
@given(
    lens=sequences(),
    num_kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 4]),  # 4 with one KV head is MQA
    head_size=st.sampled_from([8, 16, 32]),
    block_size=st.sampled_from([1, 16, 32]),
    dtype=st.sampled_from(list(TOLERANCES)),
    causal=st.booleans(),
    window=st.none() | st.integers(1, 40),
    soft_cap=st.none() | st.floats(1.0, 30.0),
    scale=st.floats(0.05, 0.5),
    one_block_tiles=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_attention(lens, num_kv_heads, group, head_size, block_size, dtype,
                                 causal, window, soft_cap, scale, one_block_tiles, seed):
    seq_lens, query_lens = lens
    batch = make_batch(seq_lens, query_lens, num_kv_heads * group, num_kv_heads, head_size,
                       block_size, dtype, seed)
    tile_bytes = ONE_BLOCK_TILES if one_block_tiles else attention._TILE_BYTES
    with mock.patch.object(attention, "_TILE_BYTES", tile_bytes):
        assert_matches_dense(batch, scale, causal, window if causal else None, soft_cap)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sliding_window", [None, 100])
def test_decode_batch_with_long_contexts(dtype, sliding_window):
    """Decode-only batch with a realistic head shape and uneven context lengths."""
    seq_lens = [700, 1, 333, 512]
    batch = make_batch(seq_lens, [1] * len(seq_lens), num_heads=32, num_kv_heads=8,
                       head_size=128, block_size=16, dtype=dtype, seed=1)
    assert_matches_dense(batch, 128**-0.5, sliding_window=sliding_window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("soft_cap", [None, 20.0])
def test_mixed_batch_with_long_contexts(dtype, soft_cap):
    """Prefill + chunked prefill + decode in one call, with a sliding window."""
    batch = make_batch([300, 420, 257], [300, 64, 1], num_heads=8, num_kv_heads=2,
                       head_size=64, block_size=16, dtype=dtype, seed=2)
    assert_matches_dense(batch, 0.125, sliding_window=96, soft_cap=soft_cap)


@pytest.mark.parametrize(("options", "match"), [
    ({"causal": False, "sliding_window": 4}, "sliding_window needs causal"),
    ({"sliding_window": 0}, "sliding_window must be >= 1"),
    ({"soft_cap": 0.0}, "soft_cap must be > 0"),
])
def test_params_refuse_masks_the_op_does_not_define(options, match):
    with pytest.raises(ValueError, match=match):
        PagedAttentionParams(0.3, **options)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    batch = make_batch([8], [8], 3, 2, 8, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"query heads \(3\).*KV heads \(2\)"):
        paged_attention(batch.query, batch.kv_cache, metadata(batch), PagedAttentionParams(0.3))


def test_block_tables_must_cover_max_seq_len():
    batch = make_batch([40], [1], 2, 1, 8, 16, torch.float32, seed=0)  # 3 blocks + 1 spare
    with pytest.raises(ValueError, match="block_tables has 2 columns; 40 tokens need 3"):
        paged_attention(batch.query, batch.kv_cache, metadata(batch, batch.block_tables[:, :2]),
                        PagedAttentionParams(0.3))


def test_release_0_1_call_forms_give_the_current_forms_results():
    from hwplug import ops

    batch = make_batch([20, 7], [3, 7], 4, 2, 16, 8, torch.float32, seed=5)
    params = PagedAttentionParams(0.25, True, 6, 30.0)
    want = ops.paged_attention(batch.query, batch.kv_cache, metadata(batch), params)
    with pytest.warns(DeprecationWarning, match="arguments written out"):
        got = ops.paged_attention(batch.query, batch.kv_cache, batch.block_tables,
                                  batch.seq_lens, batch.query_start_loc, 0.25, True, 6,
                                  soft_cap=30.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)

    key, value = torch.randn(2, 3, 2, 16)
    slots = torch.tensor([3, -1, 12])
    scale = torch.tensor([0.5, 2.0])
    caches = [torch.zeros(2, 4, 8, 2, 16, dtype=torch.float8_e4m3fn) for _ in range(2)]
    ops.reshape_and_cache(key, value, caches[0], slots,
                          PagedAttentionParams(1.0, k_scale=scale, v_scale=scale * 2))
    with pytest.warns(DeprecationWarning, match="arguments written out"):
        ops.reshape_and_cache(key, value, caches[1], slots, scale, v_scale=scale * 2)
    assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))
    assert caches[0].float().abs().sum() > 0
