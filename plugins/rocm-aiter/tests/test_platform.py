"""hwplug-rocm-aiter's platform as discovery makes it from fake sysfs trees.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake tree (``tests/fake_hw.py``), whose KFD ``gfx_target_version``
gives the ISA and so the capability and fp8 flavour, and whose amdgpu VRAM counters give
the memory. Without a ROCm torch the device queries fall back to that sighting.
"""

from __future__ import annotations

import functools

import pytest
import torch
from fake_hw import add_amd_vram, make_amd_tree, make_nvidia_tree
from plugin_checks import check_activate, check_triton_mla_backend, discovered

from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.config import EngineConfig
from hwplug.dtypes import FNUZ_FEATURE
from hwplug.errors import UnsupportedError
from hwplug.platform_interface import DeviceCapability, MemoryInfo
from hwplug.platforms import amd
from hwplug_rocm_aiter.platform import RocmPlatform

pytestmark = pytest.mark.skipif(torch.version.hip is not None and torch.cuda.is_available(),
                                reason="a ROCm device is present: its facts come from torch")

GIB = 1 << 30


@pytest.fixture
def amd_host(tmp_path, monkeypatch, fresh_discovery):
    """``amd_host(product, gfx_target_version, count)``: the rocm platform discovery makes
    for that node (192 GiB of VRAM per GPU, 2 GiB used)."""
    def make(product: str, gfx_target_version: int, count: int = 1) -> RocmPlatform:
        addresses = make_amd_tree(tmp_path, [product] * count,
                                  gfx_target_version=gfx_target_version)
        add_amd_vram(tmp_path, addresses, 192 * GIB, 2 * GIB)
        platform = discovered(monkeypatch, tmp_path, "rocm")
        assert isinstance(platform, RocmPlatform) and not platform.facts.available
        assert platform.sighting == amd.probe(tmp_path)
        return platform
    return make


def test_an_mi300x_is_gfx942_capability_9_4_with_fnuz_fp8(amd_host):
    mi300x = amd_host("AMD Instinct MI300X", 90402, count=8)
    facts = mi300x.facts
    assert (facts.device_name, facts.canonical_name, facts.device_count) == (
        "AMD Instinct MI300X", "mi300x", 8)
    assert facts.capability == DeviceCapability(9, 4) and mi300x.has_capability("9.0")
    assert facts.supported_kv_cache_dtypes == ("float32", "bfloat16", "float16",
                                               "fp8_e4m3fnuz")
    assert facts.notes == ("fp8 flavour e4m3fnuz on gfx942: the fp8 KV cache is fp8_e4m3fnuz "
                           "(not OCP fp8_e4m3 / fp8_e5m2), and OCP e4m3 fp8 checkpoints are "
                           "converted to e4m3fnuz, their scales doubled",)
    assert FNUZ_FEATURE in facts.features
    assert facts.supported_dtypes[0] == "bfloat16" and facts.supported_quant_methods == (
        "unquantized", "fp8", "gguf")
    assert facts.attention_backend_priority == ("ROCM_AITER", "ROCM_TRITON", "TORCH_PAGED",
                                                "ROCM_TRITON_MLA", "TORCH_MLA")
    assert (mi300x.dist_backend, mi300x.device_type, mi300x.families) == (
        "rccl", "cuda", ("triton",))
    assert mi300x.memory_info() == MemoryInfo(total=192 * GIB, free=190 * GIB)


def test_an_mi355x_is_gfx950_with_ocp_fp8_kv_caches(amd_host):
    mi355x = amd_host("AMD Instinct MI355X", 90500)
    assert mi355x.facts.capability == DeviceCapability(9, 5)
    assert mi355x.facts.supported_kv_cache_dtypes == (
        "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")
    assert FNUZ_FEATURE not in mi355x.facts.features
    assert mi355x.facts.notes == (
        "fp8 flavour e4m3fn (OCP) on gfx950: fp8 KV caches fp8_e4m3 / fp8_e5m2 and fp8 "
        "checkpoints",)
    assert "fp8" in mi355x.facts.supported_quant_methods
    config = EngineConfig(32, 8, 128, dtype="bfloat16", kv_cache_dtype="fp8_e4m3")
    mi355x.check_and_update_config(config)
    assert config.attention_backend == "ROCM_TRITON"  # AITER's wrapper takes no fp8 cache


def test_rocm_triton_mla_serves_latent_attention_and_an_fnuz_cache(amd_host, monkeypatch):
    """gfx942's fp8 latent cache (fnuz) is served by ROCM_TRITON_MLA alone (TORCH_MLA
    takes OCP fp8 only)."""
    mi300x = amd_host("AMD Instinct MI300X", 90402)
    fnuz = AttentionSpec(16, 1, 576, "bfloat16", kv_cache_dtype="fp8_e4m3fnuz", is_mla=True)
    assert select_backend(mi300x, fnuz).backend.get_name() == "ROCM_TRITON_MLA"
    check_triton_mla_backend(mi300x, "ROCM_TRITON_MLA", "triton_rocm", monkeypatch)


def test_an_mi250x_is_gfx90a_capability_9_0_without_fp8(amd_host):
    mi250x = amd_host("AMD Instinct MI250X", 90010)
    assert mi250x.facts.capability == DeviceCapability(9, 0)
    assert mi250x.facts.notes == ("no fp8 on gfx90a: no fp8 KV cache or checkpoint",)
    assert "fp8" not in mi250x.facts.supported_quant_methods
    with pytest.raises(UnsupportedError, match="KV-cache dtype 'fp8_e4m3' is not supported "
                                               "on platform 'rocm'"):
        mi250x.check_and_update_config(
            EngineConfig(32, 8, 128, dtype="bfloat16", kv_cache_dtype="fp8_e4m3"))


def test_without_vram_counters_memory_is_unknown(tmp_path, monkeypatch, fresh_discovery):
    make_amd_tree(tmp_path, ["AMD Radeon PRO W7900"], gfx_target_version=110000)
    platform = discovered(monkeypatch, tmp_path, "rocm")
    assert platform.facts.capability == DeviceCapability(11, 0)
    with pytest.raises(UnsupportedError, match="cannot report memory"):
        platform.memory_info()


@pytest.mark.parametrize("builder, expected", [
    (make_amd_tree, "hwplug_rocm_aiter.platform:RocmPlatform"),
    (functools.partial(make_amd_tree, products=[None], kfd=False),  # amdgpu, no ROCm driver
     "hwplug_rocm_aiter.platform:RocmPlatform"),
    (make_nvidia_tree, None),
    (lambda root: None, None),
], ids=["kfd", "drm-only", "nvidia", "empty"])
def test_activate_answers_for_amd_gpus_only(tmp_path, builder, expected):
    builder(tmp_path)
    check_activate("rocm", tmp_path, expected, RocmPlatform)
