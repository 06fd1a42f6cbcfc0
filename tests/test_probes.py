"""The cheap hardware probes of ``hwplug.platforms`` against fake /proc, /sys and /dev trees."""

from __future__ import annotations

import dataclasses
import functools
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fake_hw import (
    ArmCore,
    add_pci_function,
    arm_cpuinfo,
    make_amd_tree,
    make_intel_tree,
    make_nvidia_tree,
    make_tpu_tree,
    write,
)

from hwplug.platforms import amd, arm, intel_xpu, nvidia, tpu
from hwplug.platforms.probes import ALL_PROBES, KNOWN_PLUGINS, probe_all
from hwplug.platforms.sighting import Sighting

REPO = Path(__file__).resolve().parents[1]
ACCELERATOR_TREES = {"cuda": make_nvidia_tree, "rocm": make_amd_tree, "xpu": make_intel_tree,
                     "tpu": make_tpu_tree}
NOT_ARM = functools.partial(arm.probe, machine="x86_64")


def accelerator_probes() -> dict:
    """All probes, with the Arm one pinned to an x86_64 host so the test host cannot leak in."""
    return {**ALL_PROBES, "cpu-arm": NOT_ARM}


# --- NVIDIA -------------------------------------------------------------------------------


def test_nvidia_driver_files_name_every_gpu(tmp_path):
    addresses = make_nvidia_tree(tmp_path, ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])
    seen = nvidia.probe(tmp_path)
    assert seen == Sighting(
        vendor="nvidia", device_kind="cuda", plugin_extra="cuda",
        plugin_distribution="hwplug-cuda",
        devices=("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), count=2,
        evidence=str(tmp_path / f"proc/driver/nvidia/gpus/{addresses[0]}/information"),
        details={"driver_version": "550.54.15", "capability": "9.0"})
    assert seen.install_hint == 'pip install "hwplug[cuda]"'


def test_nvidia_without_driver_is_seen_by_pci_id_and_ignores_audio_functions(tmp_path):
    addresses = make_nvidia_tree(tmp_path, ["unused"], device_id=0x2684, driver_version=None)
    add_pci_function(tmp_path, 0x10DE, 0x22BA, 0x040300)  # the card's HDMI audio function
    seen = nvidia.probe(tmp_path)
    assert (seen.devices, seen.count, dict(seen.details)) == (("10de:2684",), 1,
                                                              {"capability": "8.9"})
    assert seen.evidence == str(tmp_path / f"sys/bus/pci/devices/{addresses[0]}/vendor")


def test_nvidia_device_nodes_alone_are_enough(tmp_path):
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm"):
        write(tmp_path, f"dev/{name}")
    seen = nvidia.probe(tmp_path)
    assert (seen.devices, seen.count, seen.evidence) == (
        ("nvidia0", "nvidia1"), 2, str(tmp_path / "dev/nvidia0"))


def test_nvidia_garbled_driver_files_fall_back_to_the_bus_id(tmp_path):
    addresses = make_nvidia_tree(tmp_path, ["x", "y"])
    write(tmp_path, f"proc/driver/nvidia/gpus/{addresses[0]}/information", b"\xff\xfe\x00Mod")
    (tmp_path / f"proc/driver/nvidia/gpus/{addresses[1]}/information").unlink()
    (tmp_path / f"proc/driver/nvidia/gpus/{addresses[1]}/information").mkdir()
    write(tmp_path, "proc/driver/nvidia/version", b"\x00garbage without a version")
    seen = nvidia.probe(tmp_path)
    assert (seen.devices, seen.count, dict(seen.details)) == (tuple(addresses), 2,
                                                              {"capability": "9.0"})


# --- AMD ----------------------------------------------------------------------------------


def test_amd_kfd_topology_counts_gpus_and_names_them_by_product(tmp_path):
    make_amd_tree(tmp_path, ["AMD Instinct MI300X", None])
    seen = amd.probe(tmp_path)
    assert (seen.vendor, seen.device_kind, seen.plugin_distribution) == (
        "amd", "rocm", "hwplug-rocm-aiter")
    assert seen.devices == ("AMD Instinct MI300X", "gfx942")
    assert seen.count == 2
    assert seen.evidence == str(tmp_path / "sys/class/kfd/kfd/topology/nodes/1/properties")
    assert dict(seen.details) == {"gfx_targets": "gfx942"}
    assert seen.install_hint == 'pip install "hwplug[rocm-aiter]"'


@pytest.mark.parametrize(("version", "isa"), [(90402, "gfx942"), (90010, "gfx90a"),
                                               (110000, "gfx1100"), (100300, "gfx1030")])
def test_amd_gfx_target_version_decodes_to_the_isa_name(version, isa):
    assert amd.gfx_name(version) == isa


def test_amd_without_kfd_is_seen_through_drm_cards(tmp_path):
    addresses = make_amd_tree(tmp_path, [None, "AMD Radeon PRO W7900"], device_id=0x7448,
                              kfd=False)
    seen = amd.probe(tmp_path)
    assert seen.devices == ("1002:7448", "AMD Radeon PRO W7900")
    assert seen.evidence == str(tmp_path / "sys/class/drm/card0/device/vendor")
    assert Path(seen.evidence).resolve() == (
        tmp_path / f"sys/devices/pci0000:00/{addresses[0]}/vendor")


def test_amd_garbled_kfd_properties_do_not_count_as_gpus(tmp_path):
    write(tmp_path, "dev/kfd")
    nodes = "sys/class/kfd/kfd/topology/nodes"
    write(tmp_path, f"{nodes}/0/properties", b"\x89PNG\r\n\x1a\nsimd_count")
    write(tmp_path, f"{nodes}/1/properties", "simd_count many\ngfx_target_version \u00b2\n")
    write(tmp_path, f"{nodes}/2/properties", "simd_count \u00b2\n")
    assert amd.probe(tmp_path) is None


# --- Intel --------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["i915", "xe"])
def test_intel_gpu_on_a_gpu_driver_is_seen(tmp_path, driver):
    make_intel_tree(tmp_path, [0x0BD5, 0x56A0], driver=driver)
    seen = intel_xpu.probe(tmp_path)
    assert (seen.vendor, seen.device_kind, seen.devices, seen.count) == (
        "intel", "xpu", ("8086:0bd5", "8086:56a0"), 2)
    assert seen.evidence == str(tmp_path / "sys/class/drm/card0/device/vendor")
    assert dict(seen.details) == {"driver": driver}
    assert seen.install_hint == 'pip install "hwplug[xpu]"'


def test_intel_driver_is_found_in_the_driver_directory_when_the_link_is_missing(tmp_path):
    address, = make_intel_tree(tmp_path, driver="xe")
    (tmp_path / f"sys/devices/pci0000:00/{address}/driver").unlink()
    assert intel_xpu.probe(tmp_path).details["driver"] == "xe"


@pytest.mark.parametrize("driver", ["vfio-pci", None])
def test_intel_device_without_a_gpu_driver_is_not_seen(tmp_path, driver):
    make_intel_tree(tmp_path, driver=driver)
    assert intel_xpu.probe(tmp_path) is None


# --- TPU ----------------------------------------------------------------------------------


def test_tpu_chips_are_seen_by_pci_id_and_the_gvnic_is_not(tmp_path):
    addresses = make_tpu_tree(tmp_path, chips=4, device_id=0x006F)
    environ = {"TPU_ACCELERATOR_TYPE": "v6e-4", "TPU_NAME": "my-tpu", "HOME": "/root"}
    seen = tpu.probe(tmp_path, environ=environ)
    assert (seen.vendor, seen.device_kind, seen.devices, seen.count) == (
        "google", "tpu", ("TPU v6e",) * 4, 4)
    assert seen.evidence == str(tmp_path / f"sys/bus/pci/devices/{addresses[0]}/vendor")
    assert dict(seen.details) == {"accelerator_type": "v6e-4", "tpu_name": "my-tpu"}
    assert seen.install_hint == 'pip install "hwplug[tpu]"'


def test_tpu_device_nodes_count_only_with_an_accelerator_type(tmp_path):
    for index in range(2):
        write(tmp_path, f"dev/accel{index}")
    assert tpu.probe(tmp_path, environ={}) is None
    seen = tpu.probe(tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v4-8"})
    assert (seen.devices, seen.evidence) == (("accel0", "accel1"), str(tmp_path / "dev/accel0"))


def test_google_cloud_vm_without_tpu_is_not_a_tpu(tmp_path):
    make_tpu_tree(tmp_path, chips=0)
    write(tmp_path, "dev/vfio/vfio")
    assert tpu.probe(tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v5litepod-8"}) is None


# --- Arm ----------------------------------------------------------------------------------


def test_arm_cpuinfo_names_the_core_and_its_features(tmp_path):
    cpuinfo = arm_cpuinfo(tmp_path, [ArmCore()] * 72)
    seen = arm.probe(tmp_path, machine="aarch64")
    assert (seen.vendor, seen.device_kind, seen.devices, seen.count, seen.evidence) == (
        "arm", "cpu-arm", ("Neoverse V2",), 72, str(cpuinfo))
    assert dict(seen.details) == {"core": "Neoverse V2", "implementer": "0x41",
                                  "part": "0xd4f",
                                  "features": "aarch64 neon dotprod sve sve2 bf16 i8mm"}
    assert seen.install_hint == 'pip install "hwplug[cpu-arm]"'


def test_arm_mixed_cores_keep_only_features_every_core_has(tmp_path):
    arm_cpuinfo(tmp_path, [ArmCore(0xD0B, features="fp asimd asimddp bf16 i8mm"),
                           ArmCore(0xD0C, features="fp asimd"),
                           ArmCore(0xD0B, features="fp asimd asimddp bf16 i8mm")])
    seen = arm.probe(tmp_path, machine="arm64")
    assert (seen.devices, seen.count) == (("Cortex-A76", "Neoverse N1"), 3)
    assert seen.details["features"] == "aarch64 neon"  # arm64 (macOS) is aarch64


@pytest.mark.parametrize(("implementer", "part", "name"), [
    ("0x41", "0xd0c", "Neoverse N1"), ("0x41", "0xd40", "Neoverse V1"),
    ("0x41", "0xd49", "Neoverse N2"), ("0x41", "0xd08", "Cortex-A72"),
    ("0x61", "0x022", "Apple part 0x022"), ("0x41", "0xd99", "Arm part 0xd99"),
    ("0x51", "0x001", "implementer 0x51 part 0x001"), ("zz", "0xd0c", "Arm CPU")])
def test_arm_core_names(implementer, part, name):
    assert arm.core_name(implementer, part) == name


def test_arm_host_without_cpuinfo_is_still_an_arm_cpu(tmp_path):
    write(tmp_path, "proc/cpuinfo", b"\xff\xfe garbage")
    seen = arm.probe(tmp_path, machine="arm64")
    assert (seen.devices, seen.evidence) == (("Arm CPU",), "machine type arm64")


def test_x86_host_is_not_arm_even_with_arm_cpuinfo(tmp_path):
    arm_cpuinfo(tmp_path)
    assert arm.probe(tmp_path, machine="x86_64") is None


# --- every probe --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(accelerator_probes()))
def test_an_empty_tree_shows_nothing(tmp_path, kind):
    assert accelerator_probes()[kind](tmp_path, environ={}) is None


@pytest.mark.parametrize("kind", sorted(ACCELERATOR_TREES))
def test_each_vendors_hardware_is_seen_only_by_its_own_probe(tmp_path, kind):
    ACCELERATOR_TREES[kind](tmp_path)
    seen = probe_all(tmp_path, environ={}, probes=accelerator_probes())
    assert [s.device_kind for s in seen] == [kind]


def test_probe_all_sees_every_vendor_in_one_tree(tmp_path):
    for make_tree in ACCELERATOR_TREES.values():
        make_tree(tmp_path)
    arm_cpuinfo(tmp_path)
    probes = {**ALL_PROBES, "cpu-arm": functools.partial(arm.probe, machine="aarch64")}
    seen = probe_all(tmp_path, environ={}, probes=probes)
    assert [s.device_kind for s in seen] == list(ALL_PROBES)
    assert [s.count for s in seen] == [1, 1, 1, 4, 4]


def test_probe_all_treats_a_raising_probe_as_seeing_nothing(tmp_path, caplog):
    make_nvidia_tree(tmp_path)

    def broken(root, *, environ=None):
        raise RuntimeError("driver exploded")

    with caplog.at_level(logging.DEBUG, logger="hwplug.platforms.probes"):
        seen = probe_all(tmp_path, probes={"broken": broken, "cuda": nvidia.probe})
    assert [s.device_kind for s in seen] == ["cuda"]
    assert "driver exploded" in caplog.text


def test_sighting_is_immutable():
    seen = Sighting("v", "k", "e", "hwplug-e", ["a"], 1, "/x", {"key": "value"})
    assert seen.devices == ("a",)
    with pytest.raises(TypeError):
        seen.details["key"] = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.count = 2


def test_known_plugins_match_the_packaging_metadata():
    """Each kind's extra installs its distribution, which registers a platform of that name."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    platforms = {}
    for plugin in (REPO / "plugins").glob("*/pyproject.toml"):
        project = tomllib.loads(plugin.read_text())["project"]
        for name in project.get("entry-points", {}).get("hwplug.platforms", {}):
            platforms[name] = project["name"]
    for kind, extra in KNOWN_PLUGINS.items():
        distribution = f"hwplug-{extra}"
        assert extras[extra] == [distribution]
        assert platforms[kind] == distribution


def test_probing_imports_no_heavy_library():
    script = textwrap.dedent("""
        import sys
        from hwplug.platforms.probes import probe_all
        probe_all()
        print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'triton', 'jax', 'numpy'}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, timeout=60)
    assert result.stdout.strip() == "[]"
