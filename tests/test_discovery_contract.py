"""Discovery's contract with plugins: pluggy's calling rules, the sighting a platform gets,
families, ties between platforms, deprecated names and retired variables."""

from __future__ import annotations

import logging
import sys

import pytest
from fake_dists import add_platform

from hwplug import envs, registries
from hwplug.attention import AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.errors import ConfigError
from hwplug.kernel_registry import kernels
from hwplug.kernel_registry.reference import silu_and_mul
from hwplug.registry import current_source


@pytest.fixture
def test_variants():
    """Register kernel variants as this test's own source; they are dropped afterwards."""
    token = current_source.set(__name__)
    yield kernels
    current_source.reset(token)
    kernels.drop_source(__name__)

FEWER_ARGUMENTS_SRC = """
from hwplug import hookimpl

hwplug_api_version = ">=1,<2"
calls = []

@hookimpl
def hwplug_register_models():
    calls.append("models, no arguments")

@hookimpl
def hwplug_platform_resolved():
    calls.append("resolved, no arguments")
"""

EXTRA_ARGUMENT_SRC = """
from hwplug import hookimpl

@hookimpl
def hwplug_register_models(registry, flavour):
    pass
"""


def test_a_hookimpl_gets_only_the_arguments_it_names(site, fresh_discovery):
    mods = add_platform(site, "lean", plugin_src=FEWER_ARGUMENTS_SRC)
    fresh_discovery.current_platform()
    record = next(r for r in fresh_discovery.resolution().plugins if r.name == "lean")
    assert record.status == "loaded", record.reason
    assert sys.modules[mods["plugin"]].calls == ["models, no arguments",
                                                 "resolved, no arguments"]


def test_a_hookimpl_with_an_argument_the_hookspec_lacks_fails_the_plugin(site,
                                                                         fresh_discovery):
    add_platform(site, "greedy", accel=False, plugin_src=EXTRA_ARGUMENT_SRC)
    fresh_discovery.current_platform()
    record = next(r for r in fresh_discovery.resolution().plugins if r.name == "greedy")
    assert record.status == "failed" and "flavour" in record.reason


def test_the_platform_is_made_with_its_probes_sighting(site, fresh_discovery):
    add_platform(site, "seen", sighting=True)
    platform = fresh_discovery.current_platform()
    assert platform.name == "seen" and platform.sighting.evidence == "/dev/acme0"
    facts = platform.facts
    assert (facts.device_name, facts.device_count, facts.canonical_name) == (
        "Acme X2", 3, "acme-x2")
    assert facts.features == {"fast-math", "x2"}
    assert platform.describe()["device_name"] == "Acme X2"  # hwplug info reads the facts


def test_a_variant_needing_a_feature_serves_only_devices_that_have_it(site, fresh_discovery,
                                                                      test_variants):
    add_platform(site, "seen", sighting=True)
    platform = fresh_discovery.current_platform()
    test_variants.register_variant("silu_and_mul", "needs_x2", silu_and_mul,
                                   platforms=("seen",), features=("x2",), priority=50)
    test_variants.register_variant("silu_and_mul", "needs_x3", silu_and_mul,
                                   platforms=("seen",), features=("x3",), priority=60)
    why = kernels.explain("silu_and_mul", platform, "cpu", "float32")
    assert why.chosen.name == "needs_x2"
    assert why.rejected["needs_x3"] == "needs device feature x3 (seen has: fast-math, x2)"


def test_a_family_member_runs_what_is_registered_for_the_family(site, fresh_discovery,
                                                                test_variants):
    add_platform(site, "npu-lite", families=("npu",))
    platform = fresh_discovery.current_platform()
    test_variants.register_variant("silu_and_mul", "for_npus", silu_and_mul,
                                   platforms=("npu",), priority=50)
    assert platform.matches(("npu",)) and not platform.matches(("gpu",))
    assert kernels.explain("silu_and_mul", platform, "cpu", "float32").chosen.name == (
        "for_npus")


def test_a_tie_in_rank_says_who_won_and_how_to_choose_the_other(site, fresh_discovery):
    add_platform(site, "alpha")
    add_platform(site, "beta")
    assert fresh_discovery.current_platform().name == "alpha"
    assert ("tied in rank with beta and first by name: set HWPLUG_PLATFORM=beta to use beta"
            in fresh_discovery.resolution().reason)


def test_the_old_backend_name_is_a_deprecated_alias(fresh_discovery, caplog):
    platform = fresh_discovery.current_platform()
    registries.attention_backends.entry("REFERENCE").warned = False
    with caplog.at_level(logging.WARNING):
        selection = select_backend(platform, AttentionSpec(8, 2, 64, "float32"), "REFERENCE")
    assert selection.backend.get_name() == "TORCH_PAGED" and selection.forced
    assert "attention backend 'REFERENCE' is deprecated; use 'TORCH_PAGED'" in caplog.text
    assert "REFERENCE" not in registries.attention_backends.names()  # listings omit aliases


def test_a_retired_variable_warns_with_its_replacement_and_still_applies(fresh_discovery,
                                                                         monkeypatch, caplog):
    monkeypatch.setenv("HWPLUG_KERNEL_STRICT", "1")
    with caplog.at_level(logging.WARNING):
        fresh_discovery.current_platform()
    assert ("HWPLUG_KERNEL_STRICT is retired (renamed to pair with HWPLUG_STRICT_PLUGINS); "
            "use HWPLUG_STRICT_KERNELS instead") in caplog.text
    assert "is not used by hwplug" not in caplog.text
    assert envs.HWPLUG_STRICT_KERNELS is True
    monkeypatch.setenv("HWPLUG_STRICT_KERNELS", "0")  # the new name wins when both are set
    assert envs.HWPLUG_STRICT_KERNELS is False


def test_an_invalid_value_of_a_retired_variable_names_the_variable_set(monkeypatch):
    monkeypatch.setenv("HWPLUG_KERNEL_PREFER", "rms_norm")
    with pytest.raises(ConfigError, match="HWPLUG_KERNEL_PREFER='rms_norm'"):
        envs.get("HWPLUG_PREFERRED_KERNELS")
