"""hwplug-rocm-aiter: the probe entry point and ``RocmPlatform`` against fake sysfs trees.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake tree (``tests/fake_hw.py``).
"""

from __future__ import annotations

import functools

import pytest
from fake_hw import make_amd_tree, make_nvidia_tree
from plugin_checks import check_activate, check_no_attention_backend, discovered

from hwplug.config import EngineConfig
from hwplug.conformance import run_conformance
from hwplug.errors import UnsupportedError
from hwplug.platforms import amd
from hwplug_rocm_aiter.platform import RocmPlatform


@pytest.fixture
def mi300x(tmp_path, monkeypatch, fresh_discovery) -> RocmPlatform:
    """The platform discovery makes from the probe's sighting of an 8 x MI300X node."""
    make_amd_tree(tmp_path, ["AMD Instinct MI300X"] * 8)
    sighting = amd.probe(tmp_path)
    assert (sighting.devices, sighting.count) == (("AMD Instinct MI300X",) * 8, 8)
    assert dict(sighting.details) == {"gfx_targets": "gfx942"}
    platform = discovered(monkeypatch, tmp_path, "rocm")
    assert isinstance(platform, RocmPlatform) and platform.sighting == sighting
    return platform


def test_declared_facts(mi300x):
    assert (mi300x.name, mi300x.vendor, mi300x.device_type) == ("rocm", "amd", "cuda")
    assert mi300x.dist_backend == "nccl" and mi300x.is_accelerator
    facts = mi300x.facts
    assert facts.supported_dtypes == ("bfloat16", "float16", "float32")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float16", "float32")
    assert facts.supported_quant_methods == ("unquantized",)
    assert facts.attention_backend_priority == ()


def test_without_a_rocm_torch_the_facts_come_from_the_sighting(mi300x):
    import torch

    if torch.version.hip is not None and torch.cuda.is_available():
        pytest.skip("a ROCm device is present: names and capability come from torch")
    assert not mi300x.is_available()
    facts = mi300x.describe()
    assert (facts["device_name"], facts["canonical_device_name"], facts["device_count"]) == (
        "AMD Instinct MI300X", "mi300x", 8)
    assert (facts["capability"], facts["toolkit_version"], facts["available"]) == (
        None, None, False)
    assert not mi300x.has_capability("9.0")


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


def test_asking_for_attention_names_the_missing_backend(mi300x):
    check_no_attention_backend(mi300x, 32, 8, "bfloat16")


def test_fp8_kv_cache_is_refused_before_attention(mi300x):
    with pytest.raises(UnsupportedError, match="KV-cache dtype 'fp8_e4m3' is not supported "
                                               "on platform 'rocm'"):
        mi300x.check_and_update_config(
            EngineConfig(32, 8, 128, dtype="bfloat16", kv_cache_dtype="fp8_e4m3"))


def test_conformance_passes_and_notes_the_missing_backend():
    report = run_conformance("rocm")
    assert report.ok, report.summary()
    results = {r.check: r for r in report.results}
    assert results["probe: cheap"].status == "passed"
    assert "declares no attention backend" in results["platform facts"].detail
    assert results["registration"].status == "skipped"  # no hwplug.plugins entry point
