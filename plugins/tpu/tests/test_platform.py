"""hwplug-tpu: the probe entry point and ``TpuPlatform``'s facts.

A TPU is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake tree (``tests/fake_hw.py``) and a given environment. JAX's CPU
standing in for a TPU is real: ``JAX_PLATFORMS=cpu`` with ``HWPLUG_PLATFORM=tpu``.
"""

from __future__ import annotations

import functools
import os

import pytest
from fake_hw import make_intel_tree, make_tpu_nodes, make_tpu_tree, write
from plugin_checks import check_activate, discovered

from hwplug.config import EngineConfig
from hwplug.errors import UnsupportedError
from hwplug.platform_interface import DeviceCapability
from hwplug.platforms import tpu
from hwplug_tpu.platform import TpuPlatform
from hwplug_tpu.probe import activate

TARGET = "hwplug_tpu.platform:TpuPlatform"
STAND_IN_ENV = {"HWPLUG_PLATFORM": "tpu", "JAX_PLATFORMS": "cpu"}


@pytest.fixture
def tpu_vm(tmp_path, monkeypatch, fresh_discovery):
    """Discovery's platform for a fake TPU VM tree and ``TPU_ACCELERATOR_TYPE``."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)

    def discover(accelerator_type: str | None = None) -> TpuPlatform:
        if accelerator_type:
            monkeypatch.setenv("TPU_ACCELERATOR_TYPE", accelerator_type)
        else:
            monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
        platform = discovered(monkeypatch, tmp_path, "tpu")
        assert isinstance(platform, TpuPlatform)
        return platform

    return discover


@pytest.mark.parametrize(("build", "accelerator_type", "chip", "capability", "hbm_gib"), [
    (functools.partial(make_tpu_tree, device_id=0x005E, nodes="accel"), None, "TPU v4",
     (4, 0), 32),
    (functools.partial(make_tpu_tree, device_id=0x0063), "v5litepod-4", "TPU v5e", (5, 0), 16),
    (functools.partial(make_tpu_tree, device_id=0x0062), None, "TPU v5p", (5, 1), 95),
    (functools.partial(make_tpu_tree, device_id=0x006F), "v6e-4", "TPU v6e", (6, 0), 32),
    (functools.partial(make_tpu_tree, device_id=0x0027, nodes="accel"), "v3-8", "TPU v2/v3",
     (3, 0), 32),
    (functools.partial(make_tpu_tree, device_id=0x0027, nodes="accel"), None, "TPU v2/v3",
     (2, 0), 16),
    (make_tpu_nodes, "v5litepod-4", "vfio/0", (5, 0), 16),
    (functools.partial(make_tpu_nodes, nodes="accel"), "v4-8", "accel0", (4, 0), 32),
], ids=["v4", "v5e", "v5p", "v6e", "v3-by-type", "v2-v3-id-alone", "v5e-nodes", "v4-nodes"])
def test_generation_gives_capability_chips_and_hbm(tpu_vm, tmp_path, build, accelerator_type,
                                                    chip, capability, hbm_gib):
    build(tmp_path)
    platform = tpu_vm(accelerator_type)
    facts = platform.facts
    assert (facts.device_name, facts.device_count) == (chip, 4)
    assert facts.capability == DeviceCapability(*capability)
    assert platform.has_capability("4.0") == (capability >= (4, 0))
    if not facts.available:  # JAX sees no TPU here: HBM per chip from the generation
        memory = platform.memory_info()
        assert memory.total == memory.free == hbm_gib << 30
        assert "jax-tpu" not in facts.features


def test_unknown_accelerator_type_has_no_capability_or_memory(tpu_vm, tmp_path):
    make_tpu_nodes(tmp_path, chips=2)
    platform = tpu_vm("x9-2")
    assert platform.facts.capability is None
    if not platform.facts.available:
        with pytest.raises(UnsupportedError, match="platform 'tpu' cannot report memory"):
            platform.memory_info()


def test_declared_facts(tpu_vm, tmp_path):
    make_tpu_tree(tmp_path, chips=4, device_id=0x0063)
    platform = tpu_vm("v5litepod-4")
    assert (platform.name, platform.vendor, platform.device_type) == ("tpu", "google", "cpu")
    assert platform.dist_backend == "xla" and platform.is_accelerator
    facts = platform.facts
    assert facts.supported_dtypes == ("bfloat16", "float32")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float32")
    assert facts.attention_backend_priority == ("PALLAS_RPA",)
    with pytest.raises(UnsupportedError, match="dtype 'float16' is not supported on platform "
                                               "'tpu'; supported: bfloat16, float32"):
        platform.check_and_update_config(EngineConfig(8, 8, 128, dtype="float16"))
    config = EngineConfig(8, 2, 64, dtype="bfloat16")
    platform.check_and_update_config(config)
    assert (config.attention_backend, config.block_size) == ("PALLAS_RPA", 16)


def test_device_queries_go_through_jax(tpu_vm, tmp_path):
    jax = pytest.importorskip("jax")
    make_tpu_tree(tmp_path, chips=4, device_id=0x0063)
    platform = tpu_vm("v5litepod-4")
    assert platform.toolkit_version() == jax.__version__
    if any(d.platform == "tpu" for d in jax.devices()):
        pytest.skip("a TPU is present: the name comes from jax")
    assert not platform.is_available() and not platform.facts.available
    assert (platform.facts.device_name, platform.facts.device_count) == ("TPU v5e", 4)


@pytest.mark.parametrize("builder, env, expected", [
    (make_tpu_tree, None, TARGET),                                        # PCI ids suffice
    (functools.partial(make_tpu_tree, chips=0), None, None),              # gVNIC only
    (functools.partial(write, relpath="dev/vfio/0"), "v5litepod-1", TARGET),  # nodes + env
    (functools.partial(write, relpath="dev/accel0"), None, None),             # nodes alone
    (make_intel_tree, "v5litepod-1", None),
], ids=["pci", "gvnic-only", "vfio-with-env", "accel-without-env", "intel"])
def test_activate_answers_for_tpus_only(tmp_path, builder, env, expected):
    builder(tmp_path)
    environ = {} if env is None else {"TPU_ACCELERATOR_TYPE": env}
    check_activate("tpu", tmp_path, expected, TpuPlatform, environ=environ)


@pytest.mark.parametrize("tree", [None, make_tpu_tree], ids=["no-tpu", "tpu-vm"])
def test_jax_cpu_stands_in_when_asked_for(tmp_path, tree):
    if tree:
        tree(tmp_path)
    answer = activate(tmp_path, environ=STAND_IN_ENV)
    assert answer.platform == TARGET
    assert (answer.sighting.devices, answer.sighting.count) == (("JAX CPU",), 1)
    assert dict(answer.sighting.details) == {"jax_backend": "cpu"}
    assert answer.sighting.evidence == "JAX_PLATFORMS=cpu with HWPLUG_PLATFORM=tpu"


@pytest.mark.parametrize("environ", [
    {"HWPLUG_PLATFORM": "tpu"}, {"JAX_PLATFORMS": "cpu"},
    {"HWPLUG_PLATFORM": "cpu", "JAX_PLATFORMS": "cpu"},
    {"HWPLUG_PLATFORM": "tpu", "JAX_PLATFORMS": "cpu,tpu"},
], ids=["platform-only", "jax-only", "other-platform", "jax-tpu-too"])
def test_jax_cpu_stands_in_only_then(tmp_path, environ):
    assert activate(tmp_path, environ=environ) is None
    make_tpu_tree(tmp_path)
    assert activate(tmp_path, environ=environ).sighting.devices == ("TPU v5e",) * 4


def test_stand_in_facts(stand_in):
    facts = stand_in.facts
    assert facts.available and facts.capability is None
    assert facts.features == frozenset({"jax-cpu"})
    assert facts.supported_dtypes == ("float32", "bfloat16")
    assert (facts.device_name, facts.canonical_name) == ("JAX CPU", "jax-cpu")
    assert any("stands in for a TPU" in note for note in facts.notes)
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert stand_in.memory_info().total == pages


def test_tpu_generation_table_matches_the_chip_names():
    named = {tpu.generation(tpu.KIND.sighting([chip], "pci")) for chip in tpu.TPU_CHIPS.values()}
    assert None not in named and len(named) == len(tpu.TPU_CHIPS)
