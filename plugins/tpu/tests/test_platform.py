"""hwplug-tpu: the probe entry point and ``TpuPlatform`` against fake TPU VM trees.

Hardware is simulated only at the probe boundary: ``hwplug.platforms.tpu.probe`` reads a
fake tree (``tests/fake_hw.py``) and the real ``TPU_*`` environment variables; for
``activate``, which probes ``/``, the plugin's ``tpu`` reference is pointed at that same
probe bound to the fake tree.
"""

from __future__ import annotations

import functools
import types
from importlib.metadata import entry_points

import pytest
from fake_hw import make_intel_tree, make_tpu_tree, write

import hwplug_tpu.probe as probe_module
from hwplug.attention import AttentionSpec, select_backend
from hwplug.config import EngineConfig
from hwplug.conformance import run_conformance
from hwplug.errors import UnsupportedError
from hwplug.platforms import tpu
from hwplug.registry import import_object
from hwplug_tpu.platform import TpuPlatform

TARGET = "hwplug_tpu.platform:TpuPlatform"
NO_BACKEND = ("platform 'tpu' declares no attention backend: its plugin has not "
              "registered one yet")


def tpu_probe_at(root) -> types.SimpleNamespace:
    """Stands in for the ``hwplug.platforms.tpu`` module: the real probe, on ``root``."""
    return types.SimpleNamespace(probe=functools.partial(tpu.probe, root))


@pytest.fixture
def v5e(tmp_path) -> TpuPlatform:
    """The platform created from the probe's sighting of a v5litepod-4 VM."""
    make_tpu_tree(tmp_path, chips=4, device_id=0x0063)
    sighting = tpu.probe(tmp_path, environ={"TPU_ACCELERATOR_TYPE": "v5litepod-4"})
    assert (sighting.devices, sighting.count) == (("TPU v5e",) * 4, 4)
    assert dict(sighting.details) == {"accelerator_type": "v5litepod-4"}
    return TpuPlatform(sighting)


def test_declared_facts(v5e):
    assert (v5e.name, v5e.vendor, v5e.device_type) == ("tpu", "google", "tpu")
    assert v5e.dist_backend == "xla" and v5e.is_accelerator
    assert v5e.supported_dtypes == ("bfloat16", "float32")
    assert v5e.supported_kv_cache_dtypes == ("bfloat16", "float32")
    assert v5e.attention_backend_priority == ()
    with pytest.raises(UnsupportedError, match="dtype 'float16' is not supported on platform "
                                               "'tpu'; supported: bfloat16, float32"):
        v5e.check_and_update_config(EngineConfig(8, 8, 128, dtype="float16"))


def test_device_queries_go_through_jax(v5e):
    jax = pytest.importorskip("jax")
    assert v5e.toolkit_version() == jax.__version__
    if any(d.platform == "tpu" for d in jax.devices()):
        pytest.skip("a TPU is present: the name comes from jax")
    assert not v5e.is_available() and v5e.device_count() == 0
    assert v5e.get_device_name() == "Google TPU"


@pytest.mark.parametrize("builder, env, expected", [
    (make_tpu_tree, None, TARGET),                                        # PCI ids suffice
    (functools.partial(make_tpu_tree, chips=0), None, None),              # gVNIC only
    (functools.partial(write, relpath="dev/vfio/0"), "v5litepod-1", TARGET),  # nodes + env
    (functools.partial(write, relpath="dev/accel0"), None, None),             # nodes alone
    (make_intel_tree, "v5litepod-1", None),
], ids=["pci", "gvnic-only", "vfio-with-env", "accel-without-env", "intel"])
def test_activate_answers_for_tpus_only(tmp_path, monkeypatch, builder, env, expected):
    builder(tmp_path)
    if env is None:
        monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    else:
        monkeypatch.setenv("TPU_ACCELERATOR_TYPE", env)
    (ep,) = [ep for ep in entry_points(group="hwplug.platforms") if ep.name == "tpu"]
    assert ep.value == "hwplug_tpu.probe:activate"
    monkeypatch.setattr(probe_module, "tpu", tpu_probe_at(tmp_path))
    target = ep.load()()
    assert target == expected
    if target is not None:
        assert import_object(target) is TpuPlatform and TpuPlatform.name == ep.name


def test_asking_for_attention_names_the_missing_backend(v5e):
    with pytest.raises(UnsupportedError) as excinfo:
        select_backend(v5e, AttentionSpec(16, 16, 128, "bfloat16"))
    assert str(excinfo.value) == NO_BACKEND
    with pytest.raises(UnsupportedError, match=NO_BACKEND):
        v5e.check_and_update_config(EngineConfig(16, 16, 128, dtype="bfloat16"))


def test_conformance_accepts_xla_as_a_documented_dist_backend():
    report = run_conformance("tpu")
    assert report.ok, report.summary()
    detail = {r.check: r for r in report.results}["platform facts"].detail
    assert "dist_backend 'xla' is not a torch.distributed backend" in detail
    assert "declares no attention backend" in detail
