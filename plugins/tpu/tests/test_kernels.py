"""hwplug-tpu's JAX variants against the pure-torch references, and their compilations.

The conformance kit draws the cache ops' inputs in the layout the JAX variants declare
(``RPA_INTERLEAVED``), and they decline most of them (non-causal attention, fp16 and fp8
caches). Here they get the kit's cases (prefill, chunked prefill and decode mixed, GQA,
windows, soft caps, padding slots, shuffled blocks) made into inputs they serve: the
cache interleaved with the layout's ``from_reference``, causal, a float32 or bfloat16
cache, no fp8 scales; what they decline is checked separately. The other ops' variants are checked by the kit
(``test_attention.py``). Everything runs on JAX's CPU backend.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pallas_interpreter import tpu_interpret_mode

from hwplug import kernels
from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.conformance import inputs
from hwplug.conformance.compare import compare_outputs, loosest_tolerance, mismatch
from hwplug.conformance.inputs import Case
from hwplug.dtypes import dtype_name
from hwplug.kernel_registry import ops
from hwplug_tpu import rpa, variants
from hwplug_tpu.bridge import bucket
from hwplug_tpu.compilations import compilations
from hwplug_tpu.layout import RPA_INTERLEAVED

JAX_DTYPES = ("float32", "bfloat16")
EXAMPLES = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def metadata(block_tables: object, seq_lens: list[int], query_start_loc: list[int]
             ) -> AttentionMetadata:
    """Attention metadata from lists (no slots)."""
    query_lens = [b - a for a, b in zip(query_start_loc[:-1], query_start_loc[1:], strict=True)]
    return AttentionMetadata(torch.zeros(0, dtype=torch.int64),
                             torch.as_tensor(block_tables, dtype=torch.int32),
                             torch.tensor(seq_lens, dtype=torch.int32),
                             torch.tensor(query_start_loc, dtype=torch.int32), max(query_lens),
                             max(seq_lens))


def interleaved(nhd: torch.Tensor) -> torch.Tensor:
    """An ``NHD`` cache ``[2, N, bs, Hkv, D]`` as ``[N, bs, 2 * Hkv, D]``, K/V interleaved."""
    _, blocks, block_size, heads, size = nhd.shape
    pages = nhd.new_empty(RPA_INTERLEAVED.shape(blocks, block_size, heads, size))
    RPA_INTERLEAVED.from_reference(nhd, pages)
    return pages


def served(case: Case, cache_arg: int, causal: bool) -> Case:
    """``case`` with its ``NHD`` cache interleaved (an fp16 or fp8 one cast to the
    dispatch tensor's dtype), no k/v scales, and causal when ``causal``."""
    cache = case.args[cache_arg]
    if cache.dtype not in variants.KV_DTYPES:
        cache = cache.float().to(case.args[0].dtype)
    params = replace(case.args[-1], k_scale=None, v_scale=None, layout=RPA_INTERLEAVED,
                     **({"causal": True} if causal else {}))
    args = (*case.args[:cache_arg], interleaved(cache), *case.args[cache_arg + 1:-1], params)
    return Case(args, {}, (case.dtypes[0], dtype_name(cache.dtype)), case.label)


def _cases(generator, cache_arg: int, causal: bool):
    return st.sampled_from(JAX_DTYPES).flatmap(
        lambda d: generator(d, st.integers(1, 9))).map(lambda c: served(c, cache_arg, causal))


@pytest.mark.slow
@EXAMPLES
@given(case=_cases(inputs.paged_attention, 1, causal=True))
def test_attention_matches_the_reference(case):
    args = case.args
    assert variants.attention_supported(*args) is None
    got = variants.paged_attention(*args)
    want = ops.paged_attention.reference(*args)
    tolerance = loosest_tolerance(ops.paged_attention.tolerances, case.dtypes)
    problem = mismatch(got, want, *tolerance)
    assert problem is None, f"{problem} at {case.label}"


@EXAMPLES
@given(case=_cases(inputs.reshape_and_cache, 2, causal=False))
def test_cache_write_matches_the_reference(case):
    key, value, pages, slots, params = case.args
    assert variants.cache_supported(*case.args) is None
    got, want = pages.clone(), pages.clone()
    assert variants.reshape_and_cache(key, value, got, slots, params) is None
    ops.reshape_and_cache.reference(key, value, want, slots, params)
    tolerance = loosest_tolerance(ops.reshape_and_cache.tolerances, case.dtypes)
    problem = compare_outputs([("cache", got)], [("cache", want)], *tolerance)
    assert problem is None, f"{problem} at {case.label}"


def test_fp8_caches_scales_and_non_causal_attention_are_declined():
    pages, fp8 = torch.zeros(2, 8, 2, 16), torch.zeros(2, 8, 2, 16, dtype=torch.float8_e4m3fn)
    key, slots, scale = torch.zeros(1, 1, 16), torch.zeros(1, dtype=torch.int64), torch.ones(())
    params = PagedAttentionParams(0.25, layout=RPA_INTERLEAVED)
    scaled = replace(params, k_scale=scale)
    assert "float8_e4m3fn is not float32 or bfloat16" in variants.cache_supported(
        key, key, fp8, slots, params)
    assert "k/v scales" in variants.cache_supported(key, key, pages, slots, scaled)
    batch = metadata([[0]], [1], [0, 1])
    assert variants.attention_supported(key, pages, batch, params) is None
    assert "causal only" in variants.attention_supported(key, pages, batch,
                                                         replace(params, causal=False))
    assert "k/v scales" in variants.attention_supported(key, pages, batch, scaled)


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 100)] == [1, 1, 2, 4, 4, 8, 8, 16, 128]


def test_each_bucket_compiles_once():
    counter = compilations()
    weight = torch.rand(48) + 0.5
    variants.rms_norm(torch.randn(5, 48), weight, 1e-6)  # bucket 8 compiles
    before = counter.count
    for rows in (6, 7, 8):
        variants.rms_norm(torch.randn(rows, 48), weight, 1e-6)
    assert counter.count == before
    variants.rms_norm(torch.randn(9, 48), weight, 1e-6)  # bucket 16
    assert counter.count == before + 1


def test_decode_steps_do_not_recompile():
    """A sequence decoding from 17 to 32 tokens (two 16-token blocks) compiles attention
    and the cache write once: the steps differ only in values, not in bucketed shapes."""
    counter = compilations()
    generator = torch.Generator().manual_seed(0)
    pages = torch.zeros(4, 16, 2 * 2, 64)
    tables = torch.tensor([[2, 0]], dtype=torch.int32)

    def step(length: int) -> torch.Tensor:
        key, value = (torch.randn(1, 2, 64, generator=generator) for _ in range(2))
        slot = tables[0, (length - 1) // 16].long() * 16 + (length - 1) % 16
        params = PagedAttentionParams(0.125, layout=RPA_INTERLEAVED)
        variants.reshape_and_cache(key, value, pages, slot.view(1), params)
        query = torch.randn(1, 4, 64, generator=generator)
        return variants.paged_attention(query, pages, metadata(tables, [length], [0, 1]),
                                        params)

    step(17)
    before = counter.count
    for length in range(18, 33):
        step(length)
    assert counter.count == before


def test_registry_serves_the_tpu_with_jax_and_declines_to_the_reference(stand_in):
    explanation = kernels.explain("paged_attention", stand_in, "cpu", "float32",
                                  layout=RPA_INTERLEAVED.name)
    assert explanation.chosen.name == "jax"
    assert "needs device feature jax-tpu" in explanation.rejected["pallas"]
    nhd = kernels.explain("paged_attention", stand_in, "cpu", "float32")
    assert nhd.chosen.name == "reference"  # an NHD cache never meets the JAX variants
    assert nhd.rejected["jax"] == "serves layouts RPA_INTERLEAVED, not NHD"
    pages = torch.randn(2, 8, 2, 16)
    args = (torch.randn(3, 1, 16), pages, metadata([[1, 0]], [10], [0, 3]))
    params = PagedAttentionParams(0.25, layout=RPA_INTERLEAVED)
    ops.paged_attention.invalidate()
    causal = ops.paged_attention(*args, params)
    non_causal = ops.paged_attention(*args, replace(params, causal=False))
    assert ops.paged_attention.variants_used() == {"jax", "reference"}
    torch.testing.assert_close(non_causal, ops.paged_attention.reference(
        *args, replace(params, causal=False)))
    assert not torch.allclose(causal, non_causal)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_kernel_in_tpu_interpret_mode_matches_pure_jax(dtype):
    """JAX's Pallas TPU kernel, run in Pallas' TPU interpret mode on CPU (with the two
    interpreter fixes of ``pallas_interpreter``), against the pure-JAX version on the same
    padded inputs: sequences of 20, 5, 33 and 0 cached tokens with 6, 1, 2 and 0 queries
    (prefill, decode, chunked prefill, padding) over shuffled pages."""
    rng = np.random.default_rng(0)
    queries = jax.numpy.asarray(rng.standard_normal((16, 8, 128)), dtype)
    kv_pages = jax.numpy.asarray(rng.standard_normal((16, 16, 8, 128)), dtype)
    batch = (jax.numpy.array([20, 5, 33, 0], "int32"),
             jax.numpy.asarray(rng.permutation(16).reshape(4, 4), "int32"),
             jax.numpy.array([0, 6, 7, 9, 9], "int32"), jax.numpy.array([3], "int32"))
    options = {"sm_scale": 0.1, "sliding_window": None, "soft_cap": None}
    want = rpa.ragged_paged_attention(queries, kv_pages, *batch, max_q_len=8, **options)
    with tpu_interpret_mode():
        got = rpa.pallas_ragged_paged_attention(queries, kv_pages, *batch, block_sizes=(2, 8),
                                                **options)
    tolerance = 2e-3 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(got, "float32"), np.asarray(want, "float32"),
                               atol=tolerance, rtol=tolerance)
    assert np.abs(np.asarray(got, "float32")).sum() > 0
