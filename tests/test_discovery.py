"""Discovery against real (temporary) distributions: platforms, plugins, failures, env."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fake_dists import add_platform, good_plugin

from hwplug import registries
from hwplug.discovery.entry_points import (
    PLUGIN_GROUP,
    distribution,
    entry_points,
    is_own,
    one_scan,
)
from hwplug.errors import ConfigError, PlatformError, PluginError
from hwplug.kernel_registry import kernels


def test_good_plugin_is_chosen_and_registers(site, fresh_discovery):
    mods = add_platform(site, "widget", plugin_src=good_plugin(site, "widget"))
    platform = fresh_discovery.current_platform()
    assert platform.name == "widget"
    resolution = fresh_discovery.resolution()
    assert "highest-ranked active accelerator" in resolution.reason
    cpu = next(c for c in resolution.candidates if c.name == "cpu")
    assert "ranked below widget" in cpu.reason
    record = next(r for r in resolution.plugins if r.name == "widget")
    assert (record.status, record.distribution) == ("loaded", "acme-widget")
    assert f"silu_and_mul/{site.module('fast_silu')}" in kernels.names()
    assert site.module("conn") in registries.connectors
    assert sys.modules[mods["plugin"]].seen == ["widget"]


def test_plugin_raising_at_import_is_isolated(site, fresh_discovery):
    add_platform(site, "broken", plugin_src="raise RuntimeError('boom at import')\n")
    add_platform(site, "fine", accel=False, plugin_src=good_plugin(site, "fine"))
    fresh_discovery.current_platform()
    records = {r.name: r for r in fresh_discovery.resolution().plugins}
    assert records["broken"].status == "failed"
    assert "boom at import" in records["broken"].reason
    assert "RuntimeError: boom at import" in records["broken"].traceback
    assert records["fine"].status == "loaded"


def test_plugin_raising_in_hook_drops_its_registrations(site, fresh_discovery):
    variant = site.module("half_written")
    src = f"""
from hwplug import hookimpl
from hwplug.kernel_registry.reference import silu_and_mul

@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("silu_and_mul", "{variant}", silu_and_mul)

@hookimpl
def hwplug_register_models(registry):
    raise ValueError("bad model table")
"""
    add_platform(site, "partial", plugin_src=src)
    add_platform(site, "other", accel=False, plugin_src=good_plugin(site, "other"))
    fresh_discovery.current_platform()
    records = {r.name: r for r in fresh_discovery.resolution().plugins}
    assert records["partial"].status == "failed"
    assert "hwplug_register_models raised ValueError('bad model table')" in records[
        "partial"].reason
    assert f"silu_and_mul/{variant}" not in kernels.names()
    assert records["other"].status == "loaded"


def test_incompatible_api_version_is_skipped_naming_both(site, fresh_discovery):
    add_platform(site, "old", plugin_src='hwplug_api_version = ">=2,<3"\n')
    fresh_discovery.current_platform()
    record = next(r for r in fresh_discovery.resolution().plugins if r.name == "old")
    assert record.status == "skipped"
    assert ">=2,<3" in record.reason and fresh_discovery.API_VERSION in record.reason


def test_two_accelerators_rank_by_priority(site, fresh_discovery):
    add_platform(site, "alpha", priority=1)
    add_platform(site, "beta", priority=5)
    assert fresh_discovery.current_platform().name == "beta"
    alpha = next(c for c in fresh_discovery.resolution().candidates if c.name == "alpha")
    assert alpha.status == "active" and "ranked below beta" in alpha.reason


def test_an_accelerator_torch_cannot_drive_is_skipped_with_its_reason(site, fresh_discovery):
    add_platform(site, "igpu", priority=9, available=False)
    add_platform(site, "usable", priority=1)
    assert fresh_discovery.current_platform().name == "usable"
    igpu = next(c for c in fresh_discovery.resolution().candidates if c.name == "igpu")
    assert igpu.status == "unavailable" and "is_available() is False" in igpu.reason


def test_inactive_and_failing_probes_are_reported(site, fresh_discovery):
    add_platform(site, "absent", active=False)
    mod = site.module("crashy")
    site.add("acme-crashy", {"hwplug.platforms": {"crashy": f"{mod}:activate"}},
             {mod: "def activate():\n    raise OSError('no /sys')\n"})
    assert fresh_discovery.current_platform().name == "cpu"
    by_name = {c.name: c for c in fresh_discovery.resolution().candidates}
    assert by_name["absent"].reason == "probe saw no hardware"
    assert by_name["crashy"].status == "failed" and "no /sys" in by_name["crashy"].reason


def test_forcing_a_missing_platform_lists_installed(site, fresh_discovery, monkeypatch):
    add_platform(site, "widget")
    monkeypatch.setenv("HWPLUG_PLATFORM", "nosuch")
    with pytest.raises(PlatformError, match="nosuch.*installed: .*cpu.*widget"):
        fresh_discovery.current_platform()


def test_forcing_a_platform_whose_probe_fails_is_an_error(site, fresh_discovery, monkeypatch):
    add_platform(site, "absent", active=False)
    monkeypatch.setenv("HWPLUG_PLATFORM", "absent")
    with pytest.raises(PlatformError, match="forced but its probe failed"):
        fresh_discovery.current_platform()


def test_forced_platform_skips_other_platforms_plugins(site, fresh_discovery, monkeypatch):
    mods = add_platform(site, "widget", plugin_src=good_plugin(site, "widget"))
    monkeypatch.setenv("HWPLUG_PLATFORM", "cpu")
    assert fresh_discovery.current_platform().name == "cpu"
    assert mods["plugin"] not in sys.modules
    record = next(r for r in fresh_discovery.resolution().plugins if r.name == "widget")
    assert "HWPLUG_PLATFORM forces 'cpu'" in record.reason


def test_allow_list_imports_nothing_else(site, fresh_discovery, monkeypatch):
    kept = add_platform(site, "kept", plugin_src=good_plugin(site, "kept"))
    dropped = add_platform(site, "dropped", priority=9, plugin_src=good_plugin(site, "dropped"))
    monkeypatch.setenv("HWPLUG_PLUGINS", "kept")
    assert fresh_discovery.current_platform().name == "kept"
    assert dropped["platform"] not in sys.modules and dropped["plugin"] not in sys.modules
    assert kept["plugin"] in sys.modules


def test_strict_mode_turns_a_failure_into_an_error(site, fresh_discovery, monkeypatch):
    add_platform(site, "broken", plugin_src="raise ImportError('missing vendor lib')\n")
    monkeypatch.setenv("HWPLUG_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="missing vendor lib"):
        fresh_discovery.current_platform()


def test_misspelt_hook_fails_the_plugin(site, fresh_discovery):
    src = """
from hwplug import hookimpl

@hookimpl
def hwplug_register_kernal(registry):
    pass
"""
    add_platform(site, "typo", plugin_src=src)
    fresh_discovery.current_platform()
    record = next(r for r in fresh_discovery.resolution().plugins if r.name == "typo")
    assert record.status == "failed" and "hwplug_register_kernal" in record.reason


def test_requires_orders_hooks(site, fresh_discovery):
    log = site.module("order_log")
    site.add("acme-log", {}, {log: "calls = []\n"})
    template = """
from hwplug import hookimpl
import {log}
hwplug_requires = {requires}

@hookimpl
def hwplug_register_kernels(registry):
    {log}.calls.append("{name}")
"""
    # "aaa" sorts first by name but requires "zzz", so "zzz" must run first.
    for name, requires in (("aaa", ("zzz",)), ("zzz", ())):
        mod = site.module(name)
        site.add(f"acme-{name}", {"hwplug.plugins": {name: mod}},
                 {mod: template.format(log=log, requires=requires, name=name)})
    fresh_discovery.current_platform()
    assert sys.modules[log].calls == ["zzz", "aaa"]


def test_one_scan_reads_the_installed_distributions_once(site):
    def names() -> set[str]:
        return {ep.name for ep in entry_points(PLUGIN_GROUP)}

    site.add("acme-first", {"hwplug.plugins": {"first": "first_mod"}}, {}, version="2.5")
    with one_scan():
        seen = {ep.name: ep for ep in entry_points(PLUGIN_GROUP)}
        site.add("acme-later", {"hwplug.plugins": {"later": "later_mod"}}, {})
        assert "first" in seen and "later" not in names()  # the scan's answer stands
        assert distribution(seen["first"]) == ("acme-first", "2.5")
        assert is_own(seen["cpu"]) and not is_own(seen["first"])
    assert {"first", "later"} <= names()  # read again outside the block


def test_import_hwplug_is_cheap():
    code = ("import sys, hwplug; assert hwplug.__version__; "
            "print(sorted(m for m in ('torch', 'triton', 'jax', 'hwplug_cuda', 'hwplug.discovery')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_unknown_variable_is_warned_by_name(fresh_discovery, monkeypatch, caplog):
    monkeypatch.setenv("HWPLUG_PLATFROM", "cpu")
    fresh_discovery.current_platform()
    assert "HWPLUG_PLATFROM is not used by hwplug (did you mean HWPLUG_PLATFORM" in caplog.text


def test_invalid_flag_value_names_valid_ones(fresh_discovery, monkeypatch):
    monkeypatch.setenv("HWPLUG_STRICT_PLUGINS", "maybe")
    with pytest.raises(ConfigError, match="HWPLUG_STRICT_PLUGINS='maybe'.*choose one of: 0, 1"):
        fresh_discovery.current_platform()


REGISTRIES_IN_A_FRESH_PROCESS = """
from hwplug import discovery, registries
print(discovery.state._state.resolution is None, sorted(registries.connectors.names()),
      "TRITON_ATTN" in registries.attention_backends, discovery.current_platform().name)
"""


def test_a_registry_read_first_runs_discovery():
    """Nothing triggers discovery but the read: the plugins' registrations are there."""
    out = subprocess.run([sys.executable, "-c", REGISTRIES_IN_A_FRESH_PROCESS],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "['cpu_offload',", "'p2p',", "'shared_storage']",
                                  "True", "cpu"]


def test_a_reset_refills_on_the_next_read(fresh_discovery):
    registries.models.names()  # discovered
    fresh_discovery.reset()
    assert fresh_discovery.state._state.resolution is None
    assert "LlamaForCausalLM" in registries.models  # read: discovered again
    assert fresh_discovery.state._state.resolution is not None


FREE_OP_IN_A_FRESH_PROCESS = """
import torch, hwplug
out = hwplug.ops.rms_norm(torch.randn(2, 64), torch.ones(64), 1e-6)
from hwplug import discovery
print(tuple(out.shape), [p.name for p in discovery.resolution().plugins if p.status != "loaded"])
"""


def test_importing_the_kernel_registry_first_does_not_discover_mid_import():
    """Defining the ops registers their references; that must not fill the registries
    (discovery would run with half the ops defined and the plugins' variants fail)."""
    out = subprocess.run([sys.executable, "-c", FREE_OP_IN_A_FRESH_PROCESS],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "(2, 64) []" and "raised" not in out.stderr
