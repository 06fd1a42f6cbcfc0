"""hwplug-cpu-arm: the probe entry point and ``ArmCpuPlatform`` against fake /proc trees.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake tree (``tests/fake_hw.py``) holding an aarch64
``/proc/sys/kernel/arch`` and ``/proc/cpuinfo``; the platform is the one discovery makes,
with its probe's sighting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fake_hw import ArmCore, arm_cpuinfo
from plugin_checks import check_activate, discovered

from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.config import EngineConfig
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import kernels
from hwplug_cpu_arm.platform import ArmCpuPlatform

#: Neoverse N1 (Graviton2, Ampere Altra): Armv8.2, no bf16, no SVE.
N1_FEATURES = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid " \
              "asimdrdm lrcpc dcpop asimddp ssbs"


@pytest.fixture
def arm_host(tmp_path, monkeypatch, fresh_discovery):
    """``arm_host(cores)``: the cpu-arm platform discovery makes for a fake Arm host."""
    def make(cores: list[ArmCore]) -> ArmCpuPlatform:
        arm_cpuinfo(tmp_path, cores)
        platform = discovered(monkeypatch, tmp_path, "cpu-arm")
        assert isinstance(platform, ArmCpuPlatform)
        return platform
    return make


def test_neoverse_v2_with_bf16_gets_bf16_first_and_its_core_name(arm_host):
    platform = arm_host([ArmCore()] * 4)
    facts = platform.describe()
    assert (facts["name"], facts["device_type"], facts["vendor"]) == ("cpu-arm", "cpu", "arm")
    assert facts["device_name"] == "Neoverse V2"
    assert facts["canonical_device_name"] == "neoverse-v2"
    assert facts["dist_backend"] == "gloo" and facts["families"] == ["cpu"]
    assert facts["features"] == ["aarch64", "bf16", "dotprod", "i8mm", "neon", "sve", "sve2"]
    # bf16 arithmetic in hardware: bfloat16 is the best dtype, so ``auto`` picks it
    assert platform.facts.supported_dtypes == ("bfloat16", "float32", "float16")
    assert platform.facts.supported_kv_cache_dtypes == (
        "float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")
    assert not platform.is_accelerator and platform.priority == 10


def test_core_without_bf16_drops_bf16_and_refuses_a_bf16_model(arm_host):
    platform = arm_host([ArmCore(part=0xD0C, features=N1_FEATURES)] * 2)
    assert platform.facts.device_name == "Neoverse N1"
    assert platform.facts.supported_dtypes == ("float32", "float16")
    assert platform.facts.supported_kv_cache_dtypes == ("float32", "float16", "fp8_e4m3",
                                                        "fp8_e5m2")
    assert "the cores lack the bf16 extension" in platform.facts.notes
    with pytest.raises(UnsupportedError, match="dtype 'bfloat16' is not supported on "
                                               "platform 'cpu-arm'; supported: float32, float16"):
        platform.check_and_update_config(EngineConfig(8, 8, 64, dtype="bfloat16"))


def test_bf16_counts_only_when_every_core_has_it(arm_host):
    platform = arm_host([ArmCore(), ArmCore(part=0xD0C, features=N1_FEATURES)])
    assert "bfloat16" not in platform.facts.supported_dtypes
    assert platform.facts.device_name == "Neoverse V2"  # named after the first core


def test_the_platform_reads_its_sighting_not_the_host(arm_host):
    # discovery hands the platform its probe's sighting: nothing is probed a second time
    platform = arm_host([ArmCore()] * 2)
    assert platform.sighting.count == 2 and platform.sighting.details["core"] == "Neoverse V2"
    assert platform.facts.device_count == 1  # one CPU device, however many cores


def test_activate_names_the_platform_only_on_an_arm_host(tmp_path):
    arm_cpuinfo(tmp_path)
    check_activate("cpu-arm", tmp_path, "hwplug_cpu_arm.platform:ArmCpuPlatform",
                   ArmCpuPlatform, machine="aarch64")
    check_activate("cpu-arm", tmp_path, None, ArmCpuPlatform, machine="x86_64")


def test_attention_uses_the_torch_paged_backend(arm_host):
    platform = arm_host([ArmCore()] * 4)
    selection = select_backend(platform, AttentionSpec(8, 2, 64, "bfloat16"))
    assert selection.backend.get_name() == "TORCH_PAGED"
    config = EngineConfig(8, 2, 64, dtype="bfloat16")
    platform.check_and_update_config(config)
    assert (config.attention_backend, config.block_size, config.kv_cache_dtype) == (
        "TORCH_PAGED", 16, "bfloat16")


def test_cpu_family_variants_serve_arm_but_onednn_linear_needs_x86(arm_host):
    platform = arm_host([ArmCore()] * 2)
    # hwplug's portable C build serves Arm; its AVX2 build needs x86 features
    rms_norm = kernels.explain("rms_norm", platform, "cpu", "float32")
    assert rms_norm.chosen.name == "fused_c" and "fused_avx2" in rms_norm.rejected
    linear = kernels.explain("linear", platform, "cpu", "float32")
    assert linear.chosen.name == "reference"
    assert linear.rejected["onednn_packed"].startswith("needs device feature x86_64 (cpu-arm "
                                                       "has: aarch64, bf16, dotprod")


@pytest.mark.parametrize(("features", "expected"), [
    (N1_FEATURES, {"neon", "dotprod"}),
    ("fp asimd evtstrm crc32 cpuid", {"neon"}),  # Cortex-A72: Armv8.0
    ("fp asimd asimddp i8mm bf16 sme sme2 sve sve2 svei8mm svebf16", {
        "neon", "dotprod", "i8mm", "bf16", "sme", "sme2", "sve", "sve2"}),
])
def test_cpuinfo_features_become_facts_under_the_names_users_know(arm_host, features,
                                                                   expected):
    # asimd is Neon and asimddp dotprod (as compilers, ACLE and KleidiAI name them); SVE's
    # own i8mm / bf16 words are not features of their own
    platform = arm_host([ArmCore(features=features)] * 2)
    assert platform.facts.features == frozenset({"aarch64", *expected})


def test_hwplug_info_shows_the_features_and_bf16_only_where_the_cores_have_it(tmp_path):
    def info(cores: list[ArmCore]) -> dict:
        arm_cpuinfo(tmp_path, cores)
        out = subprocess.run([sys.executable, "-m", "hwplug", "info", "--json"],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "HWPLUG_PROBE_ROOT": str(tmp_path)})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["platform"]

    grace = info([ArmCore()] * 2)
    assert (grace["name"], grace["device_name"]) == ("cpu-arm", "Neoverse V2")
    assert {"neon", "dotprod", "i8mm", "bf16", "sve2"} <= set(grace["features"])
    assert grace["supported_dtypes"] == ["bfloat16", "float32", "float16"]
    graviton2 = info([ArmCore(part=0xD0C, features=N1_FEATURES)] * 2)
    assert graviton2["device_name"] == "Neoverse N1" and "bf16" not in graviton2["features"]
    assert graviton2["supported_dtypes"] == ["float32", "float16"]
    assert "the cores lack the bf16 extension" in graviton2["notes"]
