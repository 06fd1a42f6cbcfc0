"""hwplug-cuda's platform, TRITON_ATTN and TRITON_MLA as discovery makes them from fake NVIDIA trees.

Hardware is simulated only at the probe boundary: discovery reads a fake ``/proc`` +
``/sys`` tree (``tests/fake_hw.py``), whose PCI device id gives the capability. Without a
GPU the device queries fall back to that sighting, so capability-dependent facts (fp8 KV
caches from 8.9) and the attention choice are decided as on the real machine.
"""

from __future__ import annotations

import pytest
import torch
from fake_hw import make_nvidia_tree
from plugin_checks import check_activate, check_triton_mla_backend, discovered

from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.kernel_registry import kernels
from hwplug.platform_interface import DeviceCapability
from hwplug_cuda.platform import CudaPlatform

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="a GPU is present: its facts come from torch.cuda")


@pytest.fixture
def nvidia_host(tmp_path, monkeypatch, fresh_discovery):
    """``nvidia_host(model, device_id)``: the cuda platform discovery makes for it."""
    def make(model: str, device_id: int) -> CudaPlatform:
        make_nvidia_tree(tmp_path, [model] * 2, device_id=device_id)
        platform = discovered(monkeypatch, tmp_path, "cuda")
        assert isinstance(platform, CudaPlatform) and not platform.facts.available
        return platform
    return make


def test_an_h100_gets_capability_9_0_and_fp8_kv_caches_from_its_sighting(nvidia_host):
    h100 = nvidia_host("NVIDIA H100 80GB HBM3", 0x2330)
    facts = h100.facts
    assert (facts.device_name, facts.canonical_name, facts.device_count) == (
        "NVIDIA H100 80GB HBM3", "h100", 2)
    assert facts.capability == DeviceCapability(9, 0) and h100.has_capability("8.9")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float16", "float32", "fp8_e4m3",
                                               "fp8_e5m2")
    assert facts.supported_dtypes[0] == "bfloat16"  # auto picks bf16 on a GPU
    assert h100.matches(("triton",))  # a Triton GPU, like rocm and xpu


def test_an_a100_has_no_fp8_kv_cache_and_says_why(nvidia_host):
    a100 = nvidia_host("NVIDIA A100-SXM4-80GB", 0x20B2)
    assert a100.facts.capability == DeviceCapability(8, 0)
    assert a100.facts.supported_kv_cache_dtypes == ("bfloat16", "float16", "float32")
    assert a100.facts.notes == ("fp8 KV cache needs capability 8.9, the device has 8.0",)


def test_triton_attn_serves_where_the_registry_chooses_its_triton_kernels(nvidia_host,
                                                                          monkeypatch):
    h100 = nvidia_host("NVIDIA H100 80GB HBM3", 0x2330)
    spec = AttentionSpec(32, 8, 128, "bfloat16")
    assert select_backend(h100, spec).backend.get_name() == "TRITON_ATTN"
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "paged_attention/triton")
    selection = select_backend(h100, spec)
    assert selection.backend.get_name() == "TORCH_PAGED"
    assert selection.rejected["TRITON_ATTN"] == [
        "paged_attention would not use its triton variant: disabled by "
        "HWPLUG_DISABLED_KERNELS"]


def test_an_h100_serves_fp8_kv_caches_with_triton_attn(nvidia_host):
    h100 = nvidia_host("NVIDIA H100 80GB HBM3", 0x2330)
    spec = AttentionSpec(32, 8, 128, "bfloat16", kv_cache_dtype="fp8_e4m3")
    assert select_backend(h100, spec).backend.get_name() == "TRITON_ATTN"


@pytest.mark.parametrize("kv_cache_dtype", [None, "fp8_e4m3"])
def test_triton_mla_serves_latent_attention_before_torch_mla(nvidia_host, monkeypatch,
                                                             kv_cache_dtype):
    h100 = nvidia_host("NVIDIA H100 80GB HBM3", 0x2330)
    check_triton_mla_backend(h100, "TRITON_MLA", "triton", monkeypatch,
                             kv_cache_dtype=kv_cache_dtype)


def test_a_v100_gets_neither_the_triton_kernels_nor_triton_attn(nvidia_host):
    """hwplug-triton's kernels are registered for cuda from capability 8.0."""
    v100 = nvidia_host("Tesla V100-SXM2-32GB", 0x1DB4)
    assert v100.facts.capability == DeviceCapability(7, 0)
    why = kernels.explain("paged_attention", v100, "cuda", "float16")
    assert why.chosen.name == "reference" and why.rejected["triton"] == "capability 7.0 below 8.0"
    selection = select_backend(v100, AttentionSpec(32, 8, 128, "float16"))
    assert selection.backend.get_name() == "TORCH_PAGED"
    assert selection.rejected["TRITON_ATTN"] == ["capability 7.0 below 8.0"]
    latent = select_backend(v100, AttentionSpec(16, 1, 576, "float16", is_mla=True))
    assert latent.backend.get_name() == "TORCH_MLA"
    assert latent.rejected["TRITON_MLA"] == ["capability 7.0 below 8.0"]


def test_activate_answers_for_nvidia_gpus_only(tmp_path):
    check_activate("cuda", tmp_path, None, CudaPlatform)
    make_nvidia_tree(tmp_path)
    check_activate("cuda", tmp_path, "hwplug_cuda.platform:CudaPlatform", CudaPlatform)


def test_fp8_quantization_needs_capability_8_9(nvidia_host):
    from hwplug.errors import UnsupportedError
    from hwplug.model_zoo.quant_methods import quant_method_for

    a100 = nvidia_host("NVIDIA A100-SXM4-80GB", 0x20B2)
    with pytest.raises(UnsupportedError, match=r"quantization 'fp8' cannot run on platform "
                                               r"'cuda' \(NVIDIA A100-SXM4-80GB\): capability "
                                               r"8.0 below 8.9"):
        quant_method_for({"quant_method": "fp8"}, a100, "bfloat16")
    assert quant_method_for({"quant_method": "int8"}, a100, "bfloat16").get_name() == "int8"
