"""hwplug-xpu: the probe entry point, ``XpuPlatform`` and the plugin's hook.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake sysfs tree (``tests/fake_hw.py``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from importlib.metadata import entry_points

import pytest
from fake_hw import make_amd_tree, make_intel_tree
from plugin_checks import check_activate, check_no_attention_backend, discovered

from hwplug.conformance import run_conformance
from hwplug.platforms import intel_xpu
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug_xpu import plugin
from hwplug_xpu.platform import XpuPlatform

IPEX_INSTALLED = importlib.util.find_spec("intel_extension_for_pytorch") is not None


@pytest.fixture
def max1550(tmp_path, monkeypatch, fresh_discovery) -> XpuPlatform:
    """The platform discovery makes from the probe's sighting of two Data Center GPU Max
    1550."""
    make_intel_tree(tmp_path, [0x0BD5, 0x0BD5], driver="i915")
    sighting = intel_xpu.probe(tmp_path)
    assert (sighting.devices, dict(sighting.details)) == (("8086:0bd5",) * 2, {"driver": "i915"})
    platform = discovered(monkeypatch, tmp_path, "xpu")
    assert isinstance(platform, XpuPlatform) and platform.sighting == sighting
    return platform


def test_declared_facts(max1550):
    assert (max1550.name, max1550.vendor, max1550.device_type) == ("xpu", "intel", "xpu")
    assert max1550.dist_backend == "xccl" and max1550.is_accelerator
    facts = max1550.facts
    assert facts.supported_dtypes == ("bfloat16", "float16", "float32")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float16", "float32")
    assert facts.attention_backend_priority == ()
    if not max1550.is_available():  # torch without an XPU device: facts from the sighting
        assert (facts.device_name, facts.device_count, facts.available) == (
            "8086:0bd5", 2, False)
        assert facts.capability is None


@pytest.mark.parametrize("builder, expected", [
    (functools.partial(make_intel_tree, driver="i915"), "hwplug_xpu.platform:XpuPlatform"),
    (functools.partial(make_intel_tree, driver="xe"), "hwplug_xpu.platform:XpuPlatform"),
    (functools.partial(make_intel_tree, driver="vfio-pci"), None),  # passed through to a VM
    (make_amd_tree, None),
], ids=["i915", "xe", "vfio-pci", "amd"])
def test_activate_answers_for_intel_gpu_drivers_only(tmp_path, builder, expected):
    builder(tmp_path)
    check_activate("xpu", tmp_path, expected, XpuPlatform)


def test_asking_for_attention_names_the_missing_backend(max1550):
    check_no_attention_backend(max1550, 32, 8, "float16")


@pytest.mark.skipif(IPEX_INSTALLED, reason="intel-extension-for-pytorch is installed")
def test_resolved_hook_suggests_the_ipex_extra_on_xpu_only(max1550, caplog):
    caplog.set_level(logging.INFO, logger=plugin.__name__)
    plugin.hwplug_platform_resolved(CpuPlatform())
    assert not caplog.records
    plugin.hwplug_platform_resolved(max1550)
    assert [r.getMessage() for r in caplog.records] == [
        'intel-extension-for-pytorch is not installed (optional: pip install '
        '"hwplug-xpu[ipex]"); hwplug-xpu has no kernels of its own yet']


def test_conformance_passes_with_its_hook_registered():
    (ep,) = [ep for ep in entry_points(group="hwplug.plugins") if ep.name == "xpu"]
    assert ep.value == "hwplug_xpu.plugin"
    report = run_conformance("xpu")
    assert report.ok, report.summary()
    results = {r.check: r for r in report.results}
    assert results["registration: hooks"].detail == "hooks: hwplug_platform_resolved"
    assert "declares no attention backend" in results["platform facts"].detail
