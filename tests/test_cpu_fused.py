"""The fused C variants of the cpu platform (rms_norm, silu_and_mul, rotary_embedding,
causal paged_attention, reshape_and_cache; the fp32 linear) against the pure-torch
references, both builds, what they decline, which a CPU gets, and the conformance kit; the
attention and the linear give a row the same bits whatever the rows beside it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from plugin_checks import discovered

from hwplug import current_platform, kernels, ops
from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.conformance import check_variant
from hwplug.conformance.inputs import BlockLayout, PagedBatch, Step
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import ops as op_defs
from hwplug.platforms.cpu.kernels import decode_supported as sdpa_decode_supported

VARIANTS = ("fused_avx2", "fused_c")
OPS = ("rms_norm", "silu_and_mul", "rotary_embedding", "paged_attention", "reshape_and_cache")


def variant(op: str, name: str):
    """The variant ``op/name`` the cpu plugin registers, loaded and its library built."""
    current_platform()  # discovery loads the plugins
    found = kernels.get(f"{op}/{name}")
    found.load()
    found.native.ensure_built()
    return found


def check(op: str, name: str, *args, **kwargs) -> None:
    """The variant serves the call and matches the reference within the op's tolerance."""
    impl = variant(op, name)
    assert impl.supports(*args, **kwargs) is None
    got, want = impl.impl(*args, **kwargs), getattr(op_defs, op).reference(*args, **kwargs)
    atol, rtol = getattr(op_defs, op).tolerances["float32"]
    for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,))), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize("name", VARIANTS)
def test_rms_norm_with_and_without_the_residual(fresh_discovery, name):
    generator = torch.Generator().manual_seed(0)
    for rows, hidden in ((1, 576), (5, 576), (3, 37), (300, 256)):  # 300 x 256: threads
        x, residual = (torch.randn(rows, hidden, generator=generator) * 3 for _ in range(2))
        weight = torch.randn(hidden, generator=generator)
        check("rms_norm", name, x, weight, 1e-5)
        check("rms_norm", name, x.view(rows, 1, hidden), weight, 1e-6, residual.view(rows, 1, -1))


@pytest.mark.parametrize("name", VARIANTS)
def test_rms_norm_of_heads_whose_tokens_sit_apart(fresh_discovery, name):
    """q heads of a fused qkv output ([T, heads, D] views, tokens a row of qkv apart, as
    Qwen3's q/k-norm sees them): bitwise what the kernel gives the contiguous copy, within
    the op's tolerance of the reference; with a residual such a view is declined."""
    generator = torch.Generator().manual_seed(7)
    qkv = torch.randn(5, 4 * 32 + 2 * 2 * 32, generator=generator)
    q = qkv[:, :4 * 32].view(5, 4, 32)
    weight = torch.randn(32, generator=generator)
    check("rms_norm", name, q, weight, 1e-6)
    norm = variant("rms_norm", name)
    assert torch.equal(norm.impl(q, weight, 1e-6), norm.impl(q.contiguous(), weight, 1e-6))
    assert "without a residual" in norm.supports(q, weight, 1e-6, q.contiguous())


@pytest.mark.parametrize("name", VARIANTS)
def test_silu_and_mul_on_every_lane_and_the_tail(fresh_discovery, name):
    generator = torch.Generator().manual_seed(1)
    for shape in ((1, 3072), (4, 26), (2, 3, 6)):  # 13 and 3 values: tails past 8 lanes
        x = torch.randn(shape, generator=generator) * 6
        x.view(-1)[:4] = torch.tensor([-100.0, 100.0, 0.0, -87.5])  # exp's clamps
        check("silu_and_mul", name, x)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rotary_embedding_full_and_partial_on_strided_heads(fresh_discovery, name, is_neox):
    generator = torch.Generator().manual_seed(2)
    for rot_dim in (64, 32):
        cache = ops.build_cos_sin_cache(rot_dim, 200, 10000.0)
        qkv = torch.randn(6, 15, 64, generator=generator)  # 9 query, 3 key, 3 value heads
        query, key = qkv[:, :9], qkv[:, 9:12]  # views: tokens 15 heads apart
        positions = torch.randint(0, 200, (6,), generator=generator)
        check("rotary_embedding", name, positions, query, key, cache, is_neox)


def decode_batch(seed: int, seq_lens: list[int], block_size: int, kv_heads: int, group: int,
                 head_size: int = 64, pad: int = 0, query_lens: list[int] | None = None):
    """A decode batch (one new token per sequence; ``query_lens[i]`` for a speculative
    verify step) over shuffled blocks: query, cache and metadata."""
    generator = torch.Generator().manual_seed(seed)
    layout = BlockLayout.shuffled(generator, seq_lens, block_size)
    query_lens = query_lens or [1] * len(seq_lens)
    batch = PagedBatch.build(layout, [Step(n - q, q) for n, q in zip(seq_lens, query_lens,
                                                                      strict=True)], pad=pad)
    query = torch.randn(sum(query_lens), kv_heads * group, head_size, generator=generator)
    kv_cache = torch.randn(2, layout.num_blocks, block_size, kv_heads, head_size,
                           generator=generator)
    return query, kv_cache, batch.metadata()


def assert_rows_alone_give_the_same_bits(name: str, query, kv_cache, metadata, params,
                                         rows) -> None:
    """Each query row ``t`` of ``rows``, run alone as a decode step of its row of
    ``metadata.decode_rows``, gets the bits it got in the whole batch (batch invariance),
    with 1 thread and with the session's."""
    impl = variant("paged_attention", name)
    every = impl.impl(query, kv_cache, metadata, params)
    decode_rows = metadata.decode_rows(query.shape[0])
    threads = torch.get_num_threads()
    for t in rows:
        alone = AttentionMetadata(
            decode_rows.slot_mapping[t:t + 1], decode_rows.block_tables[t:t + 1],
            decode_rows.seq_lens[t:t + 1], torch.tensor([0, 1], dtype=torch.int32), 1,
            int(decode_rows.seq_lens[t]))
        try:
            torch.set_num_threads(1)
            one_thread = impl.impl(query[t:t + 1], kv_cache, alone, params)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(impl.impl(query[t:t + 1], kv_cache, alone, params), every[t:t + 1])
        assert torch.equal(one_thread, every[t:t + 1]), (params.sliding_window, t)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("heads", [(9, 3), (4, 1), (2, 2)], ids=["9/3", "4/1", "2/2"])
def test_decode_attention_walks_the_block_tables(fresh_discovery, name, heads):
    hq, hkv = heads
    batch = decode_batch(hq, [37, 5, 64, 100, 1], 16, hkv, hq // hkv, pad=-1)
    for window, cap in ((None, None), (20, None), (None, 5.0), (7, 30.0), (1, None)):
        params = PagedAttentionParams(0.125, True, window, cap)
        check("paged_attention", name, *batch, params)
        # five sequences: every KV head of a row in one work item; alone: one head each
        assert_rows_alone_give_the_same_bits(name, *batch, params, range(5))
    batch = decode_batch(5, [3000, 700], 32, hkv, hq // hkv, head_size=128)  # threads
    check("paged_attention", name, *batch, PagedAttentionParams(128 ** -0.5, causal=False))


@pytest.mark.parametrize("name", VARIANTS)
def test_a_verify_step_runs_as_one_decode_row_per_query(fresh_discovery, name):
    """k + 1 causal queries per sequence (a speculative verify step), next to a sequence
    without proposals, match the reference; so does a sliding window. The rows of one
    sequence, which the kernel runs together, each get the bits their decode row alone
    gets."""
    batch = decode_batch(3, [37, 5, 64, 21], 16, 3, 3, pad=-1, query_lens=[5, 1, 3, 16])
    for window in (None, 4, 40):
        params = PagedAttentionParams(0.125, True, window)
        check("paged_attention", name, *batch, params)
        assert_rows_alone_give_the_same_bits(name, *batch, params, range(25))


@pytest.mark.parametrize("name", VARIANTS)
def test_a_prefill_runs_as_one_decode_row_per_query(fresh_discovery, name):
    """Prefill chunks longer than a verify step's, beside a decode row, match the reference
    (with and without a sliding window), and each query gets the bits a decode step of its
    row alone gives: a row's output does not depend on its step (batch invariance)."""
    batch = decode_batch(4, [37, 5, 200, 21], 16, 3, 3, pad=-1, query_lens=[37, 1, 150, 4])
    for window in (None, 20):
        params = PagedAttentionParams(0.125, True, window)
        check("paged_attention", name, *batch, params)
        assert_rows_alone_give_the_same_bits(name, *batch, params,
                                             (0, 36, 37, 38, 100, 187, 191))


@pytest.mark.parametrize("name", VARIANTS)
def test_reshape_and_cache_writes_strided_rows_into_their_slots(fresh_discovery, name):
    """Key and value split from one fused projection (token stride 2 * Hkv * D), a padding
    slot (-1) skipped, the rest of the cache untouched: the reference's cache exactly."""
    generator = torch.Generator().manual_seed(5)
    fused = torch.randn(5, 2, 3, 8, generator=generator)
    key, value = fused[:, 0], fused[:, 1]
    slots = torch.tensor([7, -1, 0, 12, 3])
    want = torch.randn(2, 2, 8, 3, 8, generator=generator)  # [2, blocks, block, Hkv, D]
    got = want.clone()
    impl = variant("reshape_and_cache", name)
    params = PagedAttentionParams(1.0)
    assert impl.supports(key, value, got, slots, params) is None
    impl.impl(key, value, got, slots, params)
    op_defs.reshape_and_cache.reference(key, value, want, slots, params)
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 8, 9, 13, 64, 130])
def test_c_linear_matches_the_reference_whatever_the_thread_count(fresh_discovery, rows):
    """One row streams the weight; 2-8 rows whose activations fit in L1 take one pass, the
    rest (K = 1536 from 4 rows, every count from 9) 4 x 3 tiles with 4 x 2 and 4 x 1 tails
    and a short last group of weight rows."""
    name = "gemv_avx2" if rows == 1 else "gemm_avx2"
    generator = torch.Generator().manual_seed(5)
    threads = torch.get_num_threads()
    # 43 outputs: groups of four weight rows and a short last one; 3072 x 576: threads
    for n, k in ((43, 16), (3072, 576), (5, 1536)):
        weight = torch.randn(n, k, generator=generator) / k**0.5
        x, bias = torch.randn(rows, k, generator=generator), torch.randn(n, generator=generator)
        check("linear", name, x, weight)
        check("linear", name, x.view(1, rows, k), weight, bias)
        try:
            torch.set_num_threads(1)
            one = variant("linear", name).impl(x, weight, bias)
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(variant("linear", name).impl(x, weight, bias), one)


def test_c_linear_gives_a_row_the_same_outputs_whatever_the_rows_beside_it(fresh_discovery):
    """Batch invariance: every output is one dot product in one order, so a row's outputs
    are the same alone (the one-row stream), in the one pass of 2-8 rows and in the 4 x 3
    tiles, wherever it sits among them."""
    generator = torch.Generator().manual_seed(6)
    gemv, gemm = variant("linear", "gemv_avx2"), variant("linear", "gemm_avx2")
    for k in (576, 1536):
        weight, x = torch.randn(99, k, generator=generator), torch.randn(70, k, generator=generator)
        every = gemm.impl(x, weight)
        assert torch.equal(torch.cat([gemv.impl(row[None], weight) for row in x]), every), k
        for count in (2, 3, 5, 7, 8, 9, 10, 13, 40):
            assert torch.equal(gemm.impl(x[-count:], weight), every[-count:]), (k, count)
    assert gemm.impl(torch.empty(0, 16), torch.randn(4, 16)).shape == (0, 4)


def test_c_linear_is_what_every_float32_linear_gets(fresh_discovery):
    platform = current_platform()
    chosen = {tokens: kernels.explain("linear", platform, "cpu", "float32", tokens).chosen.name
              for tokens in (1, 2, 64, 2048)}
    assert chosen == {1: "gemv_avx2", 2: "gemm_avx2", 64: "gemm_avx2", 2048: "gemm_avx2"}


def test_calls_the_fused_kernels_do_not_serve_are_declined_with_the_reason(fresh_discovery):
    query, kv_cache, metadata = decode_batch(0, [20, 9], 8, 2, 2)
    params = PagedAttentionParams(0.125)
    attention = variant("paged_attention", "fused_avx2")
    assert "under a causal mask" in attention.supports(
        query, kv_cache, replace(metadata, max_query_len=2), replace(params, causal=False))
    assert attention.supports(query, kv_cache, replace(metadata, max_query_len=17),
                              params) is None  # a prefill: decode rows too
    assert "up to 16 queries per sequence" in sdpa_decode_supported(
        query, kv_cache, replace(metadata, max_query_len=17), params)  # the gathering one
    fp8 = kv_cache.to(torch.float8_e4m3fn)
    assert "fp8 not done" in attention.supports(query, fp8, metadata, params)
    assert "fp8 not done" in attention.supports(query, kv_cache, metadata,
                                                replace(params, k_scale=torch.tensor(1.0)))
    odd = decode_batch(0, [20, 9], 8, 2, 2, head_size=12)
    assert "multiple of 8 up to 256, got 12" in attention.supports(*odd, params)
    wide = decode_batch(0, [20], 8, 1, 32)
    assert "up to 16 query heads per KV head, got 32/1" in attention.supports(*wide, params)
    norm = variant("rms_norm", "fused_c")
    x = torch.randn(2, 8)
    assert "float32 only, got torch.bfloat16" in norm.supports(x.bfloat16(), torch.ones(8), 1e-6)
    assert "contiguous" in norm.supports(x.t(), torch.ones(2), 1e-6)
    assert "residual [2, 4]" in norm.supports(x, torch.ones(8), 1e-6, torch.ones(2, 4))
    assert "even, nonzero" in variant("silu_and_mul", "fused_c").supports(torch.randn(2, 7))
    rotary = variant("rotary_embedding", "fused_avx2")
    cache = ops.build_cos_sin_cache(16, 10, 10000.0)
    q, k = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    assert "contiguous" in rotary.supports(torch.tensor([1, 2]), q.transpose(0, 1), k, cache, True)
    assert "int64" in rotary.supports(torch.tensor([1, 2], dtype=torch.int32), q, k, cache, True)
    write = variant("reshape_and_cache", "fused_c")
    kv = torch.zeros(2, 2, 4, 2, 16)
    slots = torch.tensor([1, 2])
    assert "fp32 KV cache" in write.supports(k, k, kv.to(torch.float8_e4m3fn), slots, params)
    assert "does not match" in write.supports(q, q, kv, slots, params)
    assert "int64" in write.supports(k, k, kv, slots.int(), params)
    gemv, weight = variant("linear", "gemv_avx2"), torch.randn(4, 16)
    assert "a multiple of 8, got [4, 12]" in gemv.supports(torch.randn(1, 12), torch.randn(4, 12))
    assert "float32 only" in gemv.supports(torch.randn(1, 16), weight.bfloat16())
    assert "contiguous" in gemv.supports(torch.randn(1, 16), torch.randn(16, 4).t())
    assert "bias of shape [3]" in gemv.supports(torch.randn(1, 16), weight, torch.randn(3))


def test_indices_out_of_range_are_typed_errors_not_reads(fresh_discovery):
    rotary = variant("rotary_embedding", "fused_avx2")
    cache = ops.build_cos_sin_cache(16, 10, 10000.0)
    q, k = torch.randn(2, 4, 16), torch.randn(2, 2, 16)
    with pytest.raises(UnsupportedError, match=r"positions must lie in \[0, 10\).* 3 \.\. 10"):
        rotary.impl(torch.tensor([3, 10]), q, k, cache, True)
    query, kv_cache, metadata = decode_batch(0, [20, 9], 8, 2, 2)
    metadata.block_tables[1, 0] = kv_cache.shape[1]  # one past the cache's blocks
    params = PagedAttentionParams(0.125)
    with pytest.raises(UnsupportedError, match="outside the cache's 7 blocks"):
        variant("paged_attention", "fused_c").impl(query, kv_cache, metadata, params)
    kv = torch.zeros(2, 2, 4, 2, 16)
    with pytest.raises(UnsupportedError, match="past the cache's 8 slots"):
        variant("reshape_and_cache", "fused_c").impl(k, k, kv, torch.tensor([1, 8]), params)
    assert not kv.any()  # checked before anything was written


def test_an_avx2_cpu_gets_the_avx2_build_and_others_the_portable(tmp_path, monkeypatch,
                                                                  fresh_discovery):
    from fake_hw import arm_cpuinfo, x86_cpuinfo

    x86_cpuinfo(tmp_path, "fpu sse sse2 avx avx2 fma f16c")
    platform = discovered(monkeypatch, tmp_path, "cpu")
    for op in OPS:
        chain = [v.name for v in kernels.explain(op, platform, "cpu", "float32").chain]
        assert chain[:2] == list(VARIANTS) and chain[-1] == "reference", chain
    arm = tmp_path / "arm"
    arm_cpuinfo(arm)
    platform = discovered(monkeypatch, arm, "cpu")
    why = kernels.explain("rms_norm", platform, "cpu", "float32")
    assert why.chosen.name == "fused_c"
    assert why.rejected["fused_avx2"].startswith("needs device feature ")


@pytest.mark.parametrize("key", [*(f"{op}/{name}" for op in OPS for name in VARIANTS),
                                 "linear/gemv_avx2", "linear/gemm_avx2"])
def test_the_conformance_kit_checks_the_variants(fresh_discovery, key):
    fresh_discovery.current_platform()
    result = check_variant(key, examples=30)
    assert result.status == "passed", result.detail
