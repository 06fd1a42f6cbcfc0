"""hwplug-rocm-aiter's attention: ROCM_AITER and ROCM_TRITON over the ROCM_PA layout, how
they are chosen and why not, AITER's internal fallbacks as data, and the conformance kit
running every Triton variant and both backends in Triton's interpreter.

AITER itself is not installed here (nor on CI), so its calls are not run: its absence is
tested as the stated rejection reason, and its ``supported`` check as the data that
routes calls to the Triton kernels.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from fake_hw import make_amd_tree
from plugin_checks import attention_call, discovered

from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.cli.kernels import collect
from hwplug.conformance import Budget, run_conformance
from hwplug_rocm_aiter import aiter_attention
from hwplug_rocm_aiter.backends import RocmTritonBackend
from hwplug_rocm_aiter.layout import ROCM_PA

AITER_INSTALLED = importlib.util.find_spec("aiter") is not None
NO_AITER = "paged_attention would not use its aiter variant: package amd-aiter not " \
           "installed (needs ==0.1.20.*)"


@pytest.fixture
def mi300x(tmp_path, monkeypatch, fresh_discovery):
    make_amd_tree(tmp_path, ["AMD Instinct MI300X"], gfx_target_version=90402)
    return discovered(monkeypatch, tmp_path, "rocm")


@pytest.mark.skipif(AITER_INSTALLED, reason="amd-aiter is installed")
def test_without_aiter_rocm_triton_serves_and_rocm_aiter_says_why(mi300x):
    selection = select_backend(mi300x, AttentionSpec(32, 8, 128, "bfloat16"))
    assert selection.backend is RocmTritonBackend
    assert selection.rejected["ROCM_AITER"] == [NO_AITER]
    fp32 = select_backend(mi300x, AttentionSpec(32, 8, 128, "float32"))
    assert fp32.backend is RocmTritonBackend
    assert fp32.rejected["ROCM_AITER"] == ["dtype float32 not in bfloat16, float16",
                                           "KV-cache dtype float32 not in bfloat16, float16"]


def test_hwplug_kernels_shows_the_triton_variants_and_the_aiter_reason(mi300x):
    data = collect(["rms_norm", "paged_attention", "reshape_and_cache"], ["bfloat16"])
    assert data["platform"] == "rocm"
    ops = {op: why["bfloat16"] for op, why in data["ops"].items()}
    assert ops["rms_norm"]["chosen"] == "triton_rocm"
    assert ops["reshape_and_cache@ROCM_PA"]["chosen"] == "triton_rocm_pa"
    for op in ("reshape_and_cache", "paged_attention"):  # over NHD: the NHD kernels only
        assert ops[op]["chosen"] == "triton_rocm"
        assert ops[op]["rejected"]["triton_rocm_pa"] == "serves layouts ROCM_PA, not NHD"
    attention = ops["paged_attention@ROCM_PA"]
    assert attention["rejected"]["triton_rocm"] == "serves layouts NHD, not ROCM_PA"
    if AITER_INSTALLED:
        assert (attention["chosen"], attention["fallbacks"]) == ("aiter", ["triton_rocm_pa",
                                                                           "reference"])
    else:
        assert (attention["chosen"], attention["fallbacks"]) == ("triton_rocm_pa",
                                                                 ["reference"])
        assert attention["rejected"]["aiter"] == "package amd-aiter not installed (needs ==0.1.20.*)"
    backends = data["attention_backends"]
    assert backends["ROCM_AITER"]["layout"] == backends["ROCM_TRITON"]["layout"] == "ROCM_PA"
    fallbacks = " | ".join(backends["ROCM_AITER"]["internal_fallbacks"])
    assert "sliding window, or head size < 64 (vLLM #34570) -> " \
           "paged_attention/triton_rocm_pa" in fallbacks


def test_the_cache_shape_and_its_head_size_rule(mi300x):
    assert RocmTritonBackend.kv_cache_shape(10, 16, 8, 128) == (2, 10, 8, 128, 16)
    spec = AttentionSpec(8, 2, 36, "bfloat16")  # 36 is not whole 16-byte chunks of bf16
    assert RocmTritonBackend.validate(spec, mi300x) == [
        "head size 36 is not a multiple of 8 (16-byte key chunks of bfloat16)"]
    assert RocmTritonBackend.validate(AttentionSpec(8, 2, 36, "float32"), mi300x) == []


def call(**change: object) -> dict[str, object]:
    """A decode call AITER accepts (meta tensors), with ``change`` applied."""
    return attention_call(**{
        "query": torch.empty(4, 8, 128, dtype=torch.bfloat16),
        "kv_cache": torch.empty(ROCM_PA.shape(6, 16, 2, 128), dtype=torch.bfloat16),
        "block_tables": torch.zeros(4, 2, dtype=torch.int32),
        "seq_lens": torch.ones(4, dtype=torch.int32),
        "query_start_loc": torch.arange(5, dtype=torch.int32), "scale": 0.1,
        "max_query_len": 1, "max_seq_len": 30, "layout": ROCM_PA, **change})


@pytest.mark.parametrize("change, reason", [
    ({"query": torch.empty(5, 8, 128, dtype=torch.bfloat16), "max_query_len": 2},
     "serves decode batches"),
    ({"sliding_window": 64}, "sliding window: the Triton kernel serves it (vLLM #34570)"),
    ({"query": torch.empty(4, 8, 32, dtype=torch.bfloat16),
      "kv_cache": torch.empty(ROCM_PA.shape(6, 16, 2, 32), dtype=torch.bfloat16)},
     "head size 32 not in 64, 128"),
    ({"soft_cap": 30.0}, "no logit soft cap"),
    ({"kv_cache": torch.empty(ROCM_PA.shape(6, 16, 2, 128), dtype=torch.float8_e4m3fn),
      "k_scale": torch.ones(()), "v_scale": torch.ones(())}, "fp8 caches take the Triton"),
    ({"kv_cache": torch.empty(ROCM_PA.shape(3, 64, 2, 128), dtype=torch.bfloat16)},
     "block size 64 not in 16, 32"),
])
def test_aiter_declines_what_it_does_not_serve(change, reason):
    assert aiter_attention.supported(**call()) is None
    assert reason in aiter_attention.supported(**call(**change))


def test_every_triton_variant_and_both_backends_pass_the_kit_in_interpret_mode(fresh_discovery):
    """A small budget in the default run; the slow test below runs the kit's own."""
    report = run_conformance("rocm", Budget(kernel_examples=3, attention_examples=1))
    assert report.ok, report.summary()
    results = {r.check: r for r in report.results}
    for variant in ("rms_norm/triton_rocm", "paged_attention/triton_rocm",
                    "reshape_and_cache/triton_rocm_pa", "paged_attention/triton_rocm_pa"):
        result = results[f"kernel {variant}"]
        assert (result.status, result.simulation) == ("simulated", "Triton interpreter")
    assert "layout ROCM_PA" in results["kernel paged_attention/triton_rocm_pa"].detail
    assert results["kv layout ROCM_PA"].status == "simulated"
    for backend in ("ROCM_AITER", "ROCM_TRITON"):
        assert "layout ROCM_PA" in results[f"attention {backend}: mixed batch"].detail
    if not AITER_INSTALLED:
        assert results["kernel paged_attention/aiter"].detail == (
            "package amd-aiter is not installed (the variant needs ==0.1.20.*)")


@pytest.mark.slow
def test_the_kit_passes_with_its_default_budget(fresh_discovery):
    report = run_conformance("rocm")
    assert report.ok, report.summary()
