"""hwplug-xpu: the probe entry point, ``XpuPlatform`` as discovery makes it from fake sysfs
trees, and the plugin's resolved hook.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake sysfs tree (``tests/fake_hw.py``). Without an XPU torch the
device queries fall back to that sighting (PCI ids, named by ``hwplug_xpu.devices``).
"""

from __future__ import annotations

import functools
import importlib.util
import logging

import pytest
from fake_hw import make_amd_tree, make_intel_tree
from plugin_checks import check_activate, check_triton_mla_backend, discovered

from hwplug.errors import UnsupportedError
from hwplug.platforms import intel_xpu
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug_xpu import plugin
from hwplug_xpu.platform import XpuPlatform

IPEX_INSTALLED = importlib.util.find_spec("intel_extension_for_pytorch") is not None


@pytest.fixture
def intel_host(tmp_path, monkeypatch, fresh_discovery):
    """``intel_host(device_id)``: the xpu platform discovery makes for two such GPUs."""
    def make(device_id: int) -> XpuPlatform:
        make_intel_tree(tmp_path, [device_id] * 2, driver="xe")
        platform = discovered(monkeypatch, tmp_path, "xpu")
        assert isinstance(platform, XpuPlatform) and platform.sighting == intel_xpu.probe(
            tmp_path)
        return platform
    return make


def test_a_max_1550_is_named_and_has_xmx(intel_host):
    max1550 = intel_host(0x0BD5)
    assert (max1550.name, max1550.vendor, max1550.device_type) == ("xpu", "intel", "xpu")
    assert (max1550.dist_backend, max1550.families, max1550.default_block_size) == (
        "xccl", ("triton",), 64)
    if max1550.is_available():
        pytest.skip("an XPU is present: its facts come from torch.xpu")
    facts = max1550.facts
    assert (facts.device_name, facts.canonical_name, facts.device_count, facts.available) == (
        "Intel(R) Data Center GPU Max 1550", "max1550", 2, False)
    assert facts.features == frozenset({"xmx"}) and facts.capability is None
    assert facts.supported_dtypes == ("bfloat16", "float16", "float32")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float16", "float32")
    assert facts.attention_backend_priority == ("XPU_IPEX", "XPU_TRITON", "TORCH_PAGED",
                                                "XPU_TRITON_MLA", "TORCH_MLA")
    with pytest.raises(UnsupportedError, match="cannot report memory"):
        max1550.memory_info()  # torch.xpu would know; the sysfs tree does not say


def test_xpu_triton_mla_serves_latent_attention(intel_host, monkeypatch):
    check_triton_mla_backend(intel_host(0x0BD5), "XPU_TRITON_MLA", "triton_xpu", monkeypatch,
                             dtype="float32")


def test_an_unlisted_gpu_keeps_its_pci_id_and_gets_no_xmx(intel_host):
    igpu = intel_host(0x46A6)  # an integrated GPU
    if igpu.is_available():
        pytest.skip("an XPU is present: its facts come from torch.xpu")
    assert igpu.facts.device_name == "8086:46a6" and igpu.facts.features == frozenset()
    assert igpu.facts.notes == ("8086:46a6 is not a GPU known to have XMX matrix engines: "
                                "IPEX's kernels are not used",)


@pytest.mark.parametrize("builder, expected", [
    (functools.partial(make_intel_tree, driver="i915"), "hwplug_xpu.platform:XpuPlatform"),
    (functools.partial(make_intel_tree, driver="xe"), "hwplug_xpu.platform:XpuPlatform"),
    (functools.partial(make_intel_tree, driver="vfio-pci"), None),  # passed through to a VM
    (make_amd_tree, None),
], ids=["i915", "xe", "vfio-pci", "amd"])
def test_activate_answers_for_intel_gpu_drivers_only(tmp_path, builder, expected):
    builder(tmp_path)
    check_activate("xpu", tmp_path, expected, XpuPlatform)


@pytest.mark.skipif(IPEX_INSTALLED, reason="intel-extension-for-pytorch is installed")
def test_resolved_hook_suggests_the_ipex_extra_on_xpu_only(intel_host, caplog):
    max1550 = intel_host(0x0BD5)
    caplog.set_level(logging.INFO, logger=plugin.__name__)
    plugin.hwplug_platform_resolved(CpuPlatform())
    assert not caplog.records
    plugin.hwplug_platform_resolved(max1550)
    assert [r.getMessage() for r in caplog.records] == [
        'intel-extension-for-pytorch is not installed (optional: pip install '
        '"hwplug-xpu[ipex]"); XPU_TRITON serves attention']
