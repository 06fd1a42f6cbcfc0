"""The built-in cpu platform's ``linear`` variants other than the C ones (tests/
test_cpu_fused.py): oneDNN's (fp32 on CPUs without AVX2, bf16 with bf16 arithmetic) and
``bf16_storage``: where they serve, and against the reference op."""

from __future__ import annotations

import threading

import pytest
import torch

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.discovery import current_platform
from hwplug.kernel_registry import kernels, ops, reference
from hwplug.platforms.cpu import bf16, tiles
from hwplug.platforms.cpu.tiles import TILE_VALUES


def explain_linear(dtype: str, num_tokens: int = 8):
    return kernels.explain("linear", current_platform(), "cpu", dtype, num_tokens)


def onednn_linear():
    """The ``onednn_packed`` variant's function (AVX2 CPUs choose the C linear first)."""
    current_platform()  # discovery registers the cpu plugin's variants
    variant = kernels.get("linear/onednn_packed")
    variant.load()
    return variant.impl


def assert_matches_reference(x, weight, bias=None, linear=None):
    """``linear`` (default: the op as dispatched) against the reference op."""
    atol, rtol = ops.linear.tolerances[str(x.dtype).removeprefix("torch.")]
    torch.testing.assert_close((linear or ops.linear)(x, weight, bias),
                               reference.linear(x, weight, bias), atol=atol, rtol=rtol)


def test_linear_on_cpu_chooses_by_dtype_and_the_cpus_features(fresh_discovery):
    c_linear = {"avx2", "fma", "f16c"} <= current_platform().facts.features
    fp32 = explain_linear("float32")
    assert fp32.chosen.name == ("gemm_avx2" if c_linear else "onednn_packed")
    assert "onednn_packed" in [v.name for v in fp32.chain]
    bf16 = explain_linear("bfloat16")
    if "bf16" in current_platform().facts.features:
        assert bf16.chosen.name == "onednn_packed_bf16"
    else:  # no bf16 arithmetic: bf16 weights, fp32 arithmetic
        assert bf16.chosen.name == "bf16_storage"
        assert bf16.rejected["onednn_packed_bf16"].startswith("needs device feature bf16")
    assert "dtype float16" in explain_linear("float16").rejected["onednn_packed"]


def test_a_cpu_with_bf16_arithmetic_ranks_bf16_first_and_gets_onednn_bf16(
        tmp_path, monkeypatch, fresh_discovery):
    from fake_hw import x86_cpuinfo

    x86_cpuinfo(tmp_path, "fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16", cpus=4,
                model="Intel(R) Xeon(R) Platinum 8480+")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    platform = fresh_discovery.current_platform()
    assert platform.name == "cpu" and platform.facts.device_name.startswith("Intel(R) Xeon")
    assert {"x86_64", "avx512_bf16", "amx_bf16", "bf16"} <= platform.facts.features
    assert platform.facts.supported_dtypes[0] == "bfloat16"
    why = kernels.explain("linear", platform, "cpu", "bfloat16")
    assert why.chosen.name == "onednn_packed_bf16"


def test_bf16_linear_matches_reference(fresh_discovery):
    gen = torch.Generator().manual_seed(3)
    x, weight = (torch.randn(4, 64, generator=gen).bfloat16(),
                 (torch.randn(48, 64, generator=gen) / 8).bfloat16())
    assert_matches_reference(x, weight)


@pytest.mark.parametrize("rows", [1, bf16.UPCAST_FROM_ROWS - 1, bf16.UPCAST_FROM_ROWS, 40])
@pytest.mark.parametrize("tile_values", [TILE_VALUES, 64 * 7], ids=["one-tile", "tiles-of-7"])
def test_bf16_storage_computes_in_fp32(monkeypatch, rows, tile_values):
    """Below the switch torch's bf16 GEMM, from it fp32 tiles of the weight (several tiles
    when a tile holds 7 rows): either way the bf16-rounded fp32 product, bias included."""
    monkeypatch.setattr(tiles, "TILE_VALUES", tile_values)
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(2, rows, 64, generator=gen).bfloat16()
    weight, bias = (torch.randn(48, 64, generator=gen) / 8).bfloat16(), torch.randn(48).bfloat16()
    want = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
    got = bf16.linear(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=8e-3)  # bf16 output steps


@pytest.mark.parametrize("leading", [(1,), (7,), (2, 5)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_onednn_linear_matches_reference(fresh_discovery, leading, with_bias):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 200, generator=gen) / 14
    bias = torch.randn(96, generator=gen) if with_bias else None
    assert_matches_reference(torch.randn(*leading, 200, generator=gen), weight, bias,
                             onednn_linear())


def test_the_tile_buffer_takes_calls_in_and_out_of_inference_mode():
    """A thread's tile buffer, first made under inference_mode, is written by a later call
    outside it (an inference tensor would refuse the write)."""
    x, weight = torch.randn(bf16.UPCAST_FROM_ROWS, 64).bfloat16(), torch.randn(48, 64).bfloat16()
    results, errors = [], []

    def run() -> None:  # a fresh thread: a fresh buffer
        try:
            with torch.inference_mode():
                results.append(bf16.linear(x, weight))
            with torch.no_grad():
                results.append(bf16.linear(x, weight))
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not errors and len(results) == 2, errors
    assert torch.equal(results[0], results[1]), (results[0] - results[1]).abs().max()


def test_a_weight_written_in_place_is_repacked(fresh_discovery):
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 64, generator=gen), torch.randn(32, 64, generator=gen)
    assert_matches_reference(x, weight, linear=onednn_linear())
    with torch.no_grad():
        weight.mul_(-2.0)
    assert_matches_reference(x, weight, linear=onednn_linear())


def test_disabling_the_c_linear_and_onednn_falls_back_to_reference(fresh_discovery,
                                                                   monkeypatch):
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "gemm_avx2,onednn_packed")
    why = explain_linear("float32")
    assert why.chosen.name == "reference"
    assert why.rejected["onednn_packed"] == "disabled by HWPLUG_DISABLED_KERNELS"


def _metadata(block_tables: torch.Tensor, seq_lens: torch.Tensor, query_lens: list[int],
              max_seq_len: int) -> AttentionMetadata:
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return AttentionMetadata(torch.zeros(0, dtype=torch.int64), block_tables, seq_lens, starts,
                             max(query_lens), max_seq_len)


@pytest.mark.parametrize(("causal", "window"), [(True, None), (True, 5), (False, None)],
                         ids=["causal", "window5", "non-causal"])
def test_sdpa_decode_matches_reference(fresh_discovery, causal, window):
    gen = torch.Generator().manual_seed(2)
    seq_lens = torch.tensor([1, 17, 40], dtype=torch.int32)  # 1, 2 and 3 blocks of 16
    kv_cache = torch.randn(2, 12, 16, 2, 32, generator=gen)
    block_tables = torch.tensor([[7, -1, -1], [3, 0, -1], [11, 5, 9]], dtype=torch.int32)
    query = torch.randn(3, 8, 32, generator=gen)  # GQA: 8 query heads over 2 KV heads
    args = (query, kv_cache, _metadata(block_tables, seq_lens, [1, 1, 1], 40),
            PagedAttentionParams(0.2, causal, window))
    current_platform()  # discovery registers the variants
    chosen = kernels.get("paged_attention/sdpa_decode")  # behind the fused C kernel
    chosen.load()
    assert chosen.supports(*args) is None
    atol, rtol = ops.paged_attention.tolerances["float32"]
    torch.testing.assert_close(chosen.impl(*args), reference.paged_attention(*args),
                               atol=atol, rtol=rtol)


def test_sdpa_decode_serves_verify_steps_and_declines_the_rest(fresh_discovery):
    current_platform()  # discovery registers the variants
    chosen = kernels.get("paged_attention/sdpa_decode")
    chosen.load()
    query, kv_cache = torch.randn(4, 2, 16), torch.randn(2, 4, 16, 2, 16)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    params = PagedAttentionParams(0.25)
    prefill = (query, kv_cache, _metadata(tables, lens, [4], 20), params)
    assert "under a causal mask" in chosen.supports(*prefill[:3], PagedAttentionParams(0.25,
                                                                                      False))
    assert "up to 16 queries" in chosen.supports(torch.randn(17, 2, 16), kv_cache,
                                                 _metadata(tables, lens, [17], 20), params)
    # four causal queries on a context (a verify step): one decode row each
    assert chosen.supports(*prefill) is None
    torch.testing.assert_close(chosen.impl(*prefill), reference.paged_attention(*prefill),
                               atol=2e-3, rtol=2e-3)
    decode = _metadata(tables, lens, [1], 20)
    assert "soft cap" in chosen.supports(query[:1], kv_cache, decode,
                                         PagedAttentionParams(0.25, soft_cap=30.0))
    bf16_cache = (query[:1], kv_cache.bfloat16(), decode, params)
    assert "KV cache in the query's dtype" in chosen.supports(*bf16_cache)
    # and the op still serves it, through the reference
    torch.testing.assert_close(ops.paged_attention(*bf16_cache),
                               reference.paged_attention(*bf16_cache))
    many = _metadata(tables.expand(64, -1), lens.expand(64), [1] * 64, 8192)
    assert "MiB of K/V" in chosen.supports(query[:1].expand(64, -1, -1), kv_cache, many, params)
