"""hwplug-tpu: the probe entry point and ``TpuPlatform`` against fake TPU VM trees.

Hardware is simulated only at the probe boundary: the probe, the ``activate`` entry point
and discovery read a fake tree (``tests/fake_hw.py``) and a given ``TPU_*`` environment.
"""

from __future__ import annotations

import functools

import pytest
from fake_hw import make_intel_tree, make_tpu_tree, write
from plugin_checks import check_activate, check_no_attention_backend, discovered

from hwplug.config import EngineConfig
from hwplug.conformance import run_conformance
from hwplug.errors import UnsupportedError
from hwplug.platforms import tpu
from hwplug_tpu.platform import TpuPlatform

TARGET = "hwplug_tpu.platform:TpuPlatform"


@pytest.fixture
def v5e(tmp_path, monkeypatch, fresh_discovery) -> TpuPlatform:
    """The platform discovery makes from the probe's sighting of a v5litepod-4 VM."""
    make_tpu_tree(tmp_path, chips=4, device_id=0x0063)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    sighting = tpu.probe(tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v5litepod-4"})
    assert (sighting.devices, sighting.count) == (("TPU v5e",) * 4, 4)
    assert dict(sighting.details) == {"accelerator_type": "v5litepod-4"}
    platform = discovered(monkeypatch, tmp_path, "tpu")
    assert isinstance(platform, TpuPlatform) and platform.sighting == sighting
    return platform


def test_declared_facts(v5e):
    assert (v5e.name, v5e.vendor, v5e.device_type) == ("tpu", "google", "tpu")
    assert v5e.dist_backend == "xla" and v5e.is_accelerator
    facts = v5e.facts
    assert facts.supported_dtypes == ("bfloat16", "float32")
    assert facts.supported_kv_cache_dtypes == ("bfloat16", "float32")
    assert facts.attention_backend_priority == ()
    with pytest.raises(UnsupportedError, match="dtype 'float16' is not supported on platform "
                                               "'tpu'; supported: bfloat16, float32"):
        v5e.check_and_update_config(EngineConfig(8, 8, 128, dtype="float16"))


def test_device_queries_go_through_jax(v5e):
    jax = pytest.importorskip("jax")
    assert v5e.toolkit_version() == jax.__version__
    if any(d.platform == "tpu" for d in jax.devices()):
        pytest.skip("a TPU is present: the name comes from jax")
    assert not v5e.is_available() and not v5e.facts.available
    assert (v5e.facts.device_name, v5e.facts.device_count) == ("TPU v5e", 4)  # the sighting


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


def test_asking_for_attention_names_the_missing_backend(v5e):
    check_no_attention_backend(v5e, 16, 16, "bfloat16")


def test_conformance_accepts_xla_as_a_documented_dist_backend():
    report = run_conformance("tpu")
    assert report.ok, report.summary()
    detail = {r.check: r for r in report.results}["platform facts"].detail
    assert "dist_backend 'xla' is not a torch.distributed backend" in detail
    assert "declares no attention backend" in detail
