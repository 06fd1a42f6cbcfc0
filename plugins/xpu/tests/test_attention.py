"""hwplug-xpu's attention: XPU_IPEX and XPU_TRITON, how they are chosen and why not, the
float32 fallback (vLLM #31762) as data and as one warning, and the conformance kit running
every Triton variant and both backends in Triton's interpreter.

IPEX is not installed in the default environment (nor on CI's default job) and is never
faked: its absence and a release outside the version gate (only its installed metadata,
as pip leaves it) are tested as the stated rejection reasons, its ``supported`` checks as
the data that route calls elsewhere. Its calls run against IPEX's CPU build in
``test_ipex_cpu.py`` (``make test-ipex``).
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from fake_dists import FakeSite, activate_site
from fake_hw import make_intel_tree
from plugin_checks import attention_call, discovered

from hwplug.attention import AttentionSpec, PagedAttentionParams
from hwplug.attention_selection import select_backend
from hwplug.cli.kernels import collect
from hwplug.config import EngineConfig
from hwplug.conformance import Budget, run_conformance
from hwplug_xpu import ipex_attention, platform
from hwplug_xpu.backends import XpuTritonBackend

IPEX_INSTALLED = importlib.util.find_spec("intel_extension_for_pytorch") is not None
NO_IPEX = "package intel-extension-for-pytorch not installed (needs >=2.7,<2.9)"


@pytest.mark.skipif(IPEX_INSTALLED, reason="intel-extension-for-pytorch is installed")
def test_without_ipex_xpu_triton_serves_and_xpu_ipex_says_why(max1550):
    selection = select_backend(max1550, AttentionSpec(32, 8, 128, "float16", block_size=64))
    assert selection.backend is XpuTritonBackend
    assert selection.rejected["XPU_IPEX"] == [
        f"reshape_and_cache would not use its ipex variant: {NO_IPEX}",
        f"paged_attention would not use its ipex variant: {NO_IPEX}"]
    data = collect(["paged_attention", "rms_norm"], ["bfloat16"])
    attention = data["ops"]["paged_attention"]["bfloat16"]
    assert (attention["chosen"], attention["rejected"]["ipex"]) == ("triton_xpu", NO_IPEX)
    assert data["ops"]["rms_norm"]["bfloat16"]["chosen"] == "triton_xpu"


def test_an_ipex_release_whose_frontend_the_calls_do_not_match_is_rejected(
        max1550, tmp_path, monkeypatch):
    """IPEX 2.6 has no ``reshape_and_cache_flash`` nor the window / soft-cap arguments: its
    installed metadata alone turns both variants down, naming the release and the range."""
    site = FakeSite(tmp_path / "site")
    site.add("intel-extension-for-pytorch", {}, {}, version="2.6.0")
    activate_site(site, monkeypatch)
    why = "intel-extension-for-pytorch 2.6.0 does not satisfy >=2.7,<2.9"
    selection = select_backend(max1550, AttentionSpec(32, 8, 128, "float16", block_size=64))
    assert selection.backend is XpuTritonBackend
    assert selection.rejected["XPU_IPEX"] == [
        f"{op} would not use its ipex variant: {why}"
        for op in ("reshape_and_cache", "paged_attention")]
    assert collect(["paged_attention"], ["bfloat16"])["ops"]["paged_attention"]["bfloat16"][
        "rejected"]["ipex"] == why


def test_a_float32_model_falls_back_to_triton_with_one_warning(max1550, caplog):
    """IPEX has no float32 kernels: XPU_IPEX rejects the spec (data), the Triton backend
    serves it, and configuring says so once per process."""
    selection = select_backend(max1550, AttentionSpec(32, 8, 128, "float32"))
    assert selection.backend is XpuTritonBackend
    assert "dtype float32 not in bfloat16, float16" in selection.rejected["XPU_IPEX"]
    caplog.set_level(logging.WARNING, logger=platform.__name__)
    for _ in range(2):
        config = EngineConfig(32, 8, 128, dtype="float32")
        max1550.check_and_update_config(config)
        assert (config.attention_backend, config.block_size) == ("XPU_TRITON", 64)
    assert [r.getMessage() for r in caplog.records] == [
        "XPU_IPEX has no float32 kernels: the float32 model runs on XPU_TRITON instead "
        "(vLLM #31762)"]
    max1550.check_and_update_config(EngineConfig(32, 8, 128, dtype="bfloat16"))
    assert len(caplog.records) == 1  # bf16 passes over nothing for its dtype
    latent = EngineConfig(16, 1, 576, dtype="float32", is_mla=True)
    max1550.check_and_update_config(latent)  # passes over XPU_IPEX, which is not MLA
    assert latent.attention_backend == "XPU_TRITON_MLA" and len(caplog.records) == 1


def test_a_gpu_without_xmx_is_not_offered_ipex(tmp_path, monkeypatch, fresh_discovery):
    make_intel_tree(tmp_path, [0x46A6])  # integrated graphics
    igpu = discovered(monkeypatch, tmp_path, "xpu")
    why = collect(["paged_attention"], ["float16"])["ops"]["paged_attention"]["float16"]
    assert why["rejected"]["ipex"] == "needs device feature xmx (xpu has: none)"
    assert select_backend(igpu, AttentionSpec(8, 8, 64, "float16")).backend is XpuTritonBackend


def call(**change: object) -> dict[str, object]:
    """A paged-attention call IPEX accepts (meta tensors), with ``change`` applied."""
    return attention_call(**{
        "query": torch.empty(5, 8, 64, dtype=torch.float16),
        "kv_cache": torch.empty(2, 6, 64, 2, 64, dtype=torch.float16),
        "block_tables": torch.zeros(2, 2, dtype=torch.int32),
        "seq_lens": torch.ones(2, dtype=torch.int32),
        "query_start_loc": torch.tensor([0, 1, 5], dtype=torch.int32), "scale": 0.1,
        "max_query_len": 4, "max_seq_len": 90, **change})


@pytest.mark.parametrize("change, reason", [
    ({"query": torch.empty(5, 8, 64)}, "needs bf16 / fp16 queries"),
    ({"kv_cache": torch.empty(2, 6, 64, 2, 64, dtype=torch.float8_e4m3fn)},
     "a cache in their dtype"),
    ({"k_scale": torch.ones(()), "v_scale": torch.ones(())}, "no k/v scales"),
])
def test_ipex_declines_what_it_does_not_serve(change, reason):
    assert ipex_attention.attention_supported(**call()) is None
    assert reason in ipex_attention.attention_supported(**call(**change))


def test_ipex_cache_write_declines_float32_fp8_and_scales():
    key = torch.empty(3, 2, 64, dtype=torch.bfloat16, device="meta")
    slots = torch.zeros(3, dtype=torch.long, device="meta")
    cache = torch.empty(2, 4, 64, 2, 64, dtype=torch.bfloat16, device="meta")
    params = PagedAttentionParams(1.0)
    assert ipex_attention.cache_supported(key, key, cache, slots, params) is None
    assert "needs a bf16 / fp16 cache" in ipex_attention.cache_supported(
        key.float(), key.float(), cache.float(), slots, params)
    assert "needs a bf16 / fp16 cache" in ipex_attention.cache_supported(
        key, key, cache.to(torch.float8_e4m3fn), slots, params)
    one = torch.ones((), device="meta")
    assert ipex_attention.cache_supported(key, key, cache, slots, PagedAttentionParams(
        1.0, k_scale=one, v_scale=one)) == "no k/v scales"


def test_every_triton_variant_and_both_backends_pass_the_kit_in_interpret_mode(fresh_discovery):
    """A small budget in the default run; the slow test below runs the kit's own."""
    report = run_conformance("xpu", Budget(kernel_examples=3, attention_examples=1))
    assert report.ok, report.summary()
    results = {r.check: r for r in report.results}
    for op in ("rms_norm", "reshape_and_cache", "paged_attention"):
        result = results[f"kernel {op}/triton_xpu"]
        assert (result.status, result.simulation) == ("simulated", "Triton interpreter")
    assert results["attention XPU_TRITON: mixed batch"].status == "simulated"
    if not IPEX_INSTALLED:
        assert results["kernel paged_attention/ipex"].detail == (
            "package intel-extension-for-pytorch is not installed (the variant needs >=2.7,<2.9)")


@pytest.mark.slow
def test_the_kit_passes_with_its_default_budget(fresh_discovery):
    report = run_conformance("xpu")
    assert report.ok, report.summary()
