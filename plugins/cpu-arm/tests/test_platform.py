"""hwplug-cpu-arm: the probe entry point and ``ArmCpuPlatform`` against fake /proc/cpuinfo.

Hardware is simulated only at the probe boundary: the probe and the ``activate`` entry
point read a fake tree (``tests/fake_hw.py``) with ``machine="aarch64"``; for a platform
created without a sighting (as discovery does), which probes ``/`` itself, the plugin's
``arm`` reference is pointed at that same probe bound to the fake tree.
"""

from __future__ import annotations

import functools
import types

import pytest
from fake_hw import NEOVERSE_V2_FEATURES, ArmCore, arm_cpuinfo
from plugin_checks import check_activate

import hwplug_cpu_arm.platform as platform_module
from hwplug import discovery
from hwplug.attention import AttentionSpec, select_backend
from hwplug.config import EngineConfig
from hwplug.errors import UnsupportedError
from hwplug.platforms import arm
from hwplug_cpu_arm.platform import ArmCpuPlatform

#: Neoverse N1 (Graviton2, Ampere Altra): Armv8.2, no bf16, no SVE.
N1_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid " \
              "asimdrdm lrcpc dcpop asimddp ssbs"


def arm_probe_at(root, machine: str = "aarch64") -> types.SimpleNamespace:
    """Stands in for the ``hwplug.platforms.arm`` module: the real probe, on ``root``."""
    return types.SimpleNamespace(probe=functools.partial(arm.probe, root, machine=machine))


def test_neoverse_v2_with_bf16_gets_bf16_and_its_core_name(tmp_path):
    arm_cpuinfo(tmp_path, [ArmCore()] * 4)
    platform = ArmCpuPlatform(arm.probe(tmp_path, machine="aarch64"))
    facts = platform.describe()
    assert (facts["name"], facts["device_type"], facts["vendor"]) == ("cpu-arm", "cpu", "arm")
    assert facts["device_name"] == "Neoverse V2"
    assert facts["canonical_device_name"] == "neoverse-v2"
    assert facts["dist_backend"] == "gloo"
    assert platform.supported_dtypes == ("float32", "bfloat16", "float16")
    assert platform.supported_kv_cache_dtypes == ("float32", "bfloat16", "float16")
    assert not platform.is_accelerator and platform.priority == 10


def test_core_without_bf16_drops_bf16_and_refuses_a_bf16_model(tmp_path):
    arm_cpuinfo(tmp_path, [ArmCore(part=0xD0C, features=N1_FEATURES)] * 2)
    platform = ArmCpuPlatform(arm.probe(tmp_path, machine="aarch64"))
    assert platform.get_device_name() == "Neoverse N1"
    assert platform.supported_dtypes == ("float32", "float16")
    assert platform.supported_kv_cache_dtypes == ("float32", "float16")
    with pytest.raises(UnsupportedError, match="dtype 'bfloat16' is not supported on "
                                               "platform 'cpu-arm'; supported: float32, float16"):
        platform.check_and_update_config(EngineConfig(8, 8, 64, dtype="bfloat16"))


def test_bf16_counts_only_when_every_core_has_it(tmp_path):
    arm_cpuinfo(tmp_path, [ArmCore(), ArmCore(part=0xD0C, features=N1_FEATURES)])
    platform = ArmCpuPlatform(arm.probe(tmp_path, machine="aarch64"))
    assert "bfloat16" not in platform.supported_dtypes
    assert platform.get_device_name() == "Neoverse V2"  # named after the first core


def test_created_without_a_sighting_it_probes_the_cpu_itself(tmp_path, monkeypatch):
    # discovery does ``platform_cls()``: the bf16 decision must not depend on a sighting
    arm_cpuinfo(tmp_path, [ArmCore(features=NEOVERSE_V2_FEATURES)] * 2)
    monkeypatch.setattr(platform_module, "arm", arm_probe_at(tmp_path), raising=False)
    platform = ArmCpuPlatform()
    assert platform.get_device_name() == "Neoverse V2"
    assert "bfloat16" in platform.supported_dtypes


def test_activate_names_the_platform_only_on_an_arm_host(tmp_path):
    arm_cpuinfo(tmp_path)
    check_activate("cpu-arm", tmp_path, "hwplug_cpu_arm.platform:ArmCpuPlatform",
                   ArmCpuPlatform, machine="aarch64")
    check_activate("cpu-arm", tmp_path, None, ArmCpuPlatform, machine="x86_64")


def test_attention_uses_the_reference_backend(tmp_path):
    discovery.resolution()  # registers the built-in REFERENCE backend
    arm_cpuinfo(tmp_path)
    platform = ArmCpuPlatform(arm.probe(tmp_path, machine="aarch64"))
    selection = select_backend(platform, AttentionSpec(8, 2, 64, "bfloat16"))
    assert selection.backend.get_name() == "REFERENCE"
    config = EngineConfig(8, 2, 64, dtype="bfloat16")
    platform.check_and_update_config(config)
    assert (config.attention_backend, config.block_size, config.kv_cache_dtype) == (
        "REFERENCE", 16, "bfloat16")


def test_pure_torch_cpu_variants_serve_arm_but_onednn_linear_does_not(tmp_path):
    from hwplug.kernel_registry import kernels

    arm_cpuinfo(tmp_path, [ArmCore()] * 2)
    platform = ArmCpuPlatform(arm.probe(tmp_path, machine="aarch64"))
    discovery.current_platform()  # registers hwplug's own variants
    assert kernels.explain("rms_norm", platform, "cpu", "float32").chosen.name == "torch_fused"
    linear = kernels.explain("linear", platform, "cpu", "float32")
    assert linear.chosen.name == "reference"
    assert linear.rejected["onednn_packed"] == "serves platform cpu, not cpu-arm"
