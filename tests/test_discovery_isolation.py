"""Plugins that exit or hang: discovery isolates them and never hangs silently.

Each plugin is a real (temporary) distribution whose probe, import or hook calls
``sys.exit``, raises another BaseException, or blocks. ``HWPLUG_PROBE_TIMEOUT`` is set low so
the hanging cases take a fraction of a second; a blocked probe waits on an event the test
sets afterwards, releasing the thread it left behind.
"""

from __future__ import annotations

import logging
import re
import sys

import pytest
from fake_dists import add_platform, good_plugin

from hwplug import registries
from hwplug.errors import PluginError
from hwplug.kernel_registry import kernels

#: A probe (``activate``) that blocks until the test releases it.
BLOCKING_PROBE = """
import threading

RELEASE = threading.Event()
calls = []

def activate():
    calls.append(1)
    RELEASE.wait()
    return None
"""
#: A plugin that registers a kernel variant, then leaves the process from a later hook.
EXIT_IN_HOOK = """
import sys
from hwplug import hookimpl
from hwplug.kernel_registry.reference import silu_and_mul

@hookimpl
def hwplug_register_kernels(registry):
    registry.register_variant("silu_and_mul", "{variant}", silu_and_mul)

@hookimpl
def hwplug_register_models(registry):
    sys.exit("{message}")
"""


def _records(discovery) -> dict:
    return {r.name: r for r in discovery.resolution().plugins}


def _candidates(discovery) -> dict:
    return {c.name: c for c in discovery.resolution().candidates}


def test_sys_exit_at_import_is_isolated(site, fresh_discovery):
    add_platform(site, "quits", plugin_src="import sys\nsys.exit(3)\n")
    add_platform(site, "fine", accel=False, plugin_src=good_plugin(site, "fine"))
    assert fresh_discovery.current_platform().name == "quits"  # its platform still ranks
    records = _records(fresh_discovery)
    assert (records["quits"].status, records["quits"].reason) == (
        "failed", "import failed: SystemExit(3)")
    assert "SystemExit: 3" in records["quits"].traceback
    assert records["fine"].status == "loaded"


@pytest.mark.parametrize("exit_call, shown", [
    ("sys.exit('{message}')", "SystemExit('vendor runtime missing')"),
    ("raise GeneratorExit('{message}')", "GeneratorExit('vendor runtime missing')"),
])
def test_sys_exit_or_another_base_exception_in_a_hook_drops_the_plugin(
        site, fresh_discovery, exit_call, shown):
    variant = site.module("registered_then_exited")
    source = EXIT_IN_HOOK.replace('sys.exit("{message}")', exit_call).format(
        variant=variant, message="vendor runtime missing")
    add_platform(site, "exits", plugin_src=source)
    add_platform(site, "fine", accel=False, plugin_src=good_plugin(site, "fine"))
    fresh_discovery.current_platform()
    records = _records(fresh_discovery)
    assert records["exits"].status == "failed"
    assert records["exits"].reason == f"hwplug_register_models raised {shown}"
    assert f"silu_and_mul/{variant}" not in kernels.names()  # its registration is dropped
    assert records["fine"].status == "loaded" and site.module("conn") in registries.connectors


def test_sys_exit_in_a_probe_fails_that_candidate_only(site, fresh_discovery):
    module = site.module("exiting_probe")
    site.add("acme-exiting", {"hwplug.platforms": {"exiting": f"{module}:activate"}},
             {module: "import sys\n\ndef activate():\n    sys.exit('no driver')\n"})
    assert fresh_discovery.current_platform().name == "cpu"
    candidate = _candidates(fresh_discovery)["exiting"]
    assert (candidate.status, candidate.reason) == (
        "failed", "probe raised SystemExit('no driver')")


def test_keyboard_interrupt_is_not_swallowed(site, fresh_discovery):
    add_platform(site, "interrupted", plugin_src="raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        fresh_discovery.current_platform()


@pytest.fixture
def blocking_probe(site, monkeypatch):
    """A platform ``stuck`` whose probe blocks; released (its thread ends) afterwards."""
    module = site.module("stuck_probe")
    site.add("acme-stuck", {"hwplug.platforms": {"stuck": f"{module}:activate"}},
             {module: BLOCKING_PROBE})
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.6")
    yield module
    if module in sys.modules:
        sys.modules[module].RELEASE.set()


def test_a_probe_that_hangs_times_out_and_says_how_to_skip_it(
        site, fresh_discovery, blocking_probe, monkeypatch, caplog):
    add_platform(site, "other", accel=False)
    with caplog.at_level(logging.WARNING, logger="hwplug.discovery"):
        assert fresh_discovery.current_platform().name == "other"
    candidate = _candidates(fresh_discovery)["stuck"]
    assert candidate.status == "failed"
    hint = re.search(r"HWPLUG_PLUGINS=(\S+)$", candidate.reason).group(1)
    assert candidate.reason == (
        "the probe of platform stuck did not answer within 0.6 s (HWPLUG_PROBE_TIMEOUT) and "
        "was left running in a background thread; to skip it, allow only the other plugins: "
        f"HWPLUG_PLUGINS={hint}")
    assert "other" in hint.split(",") and "stuck" not in hint.split(",")
    assert ("the probe of platform stuck is still running after 0.3 s; to skip it, allow only "
            f"the other plugins: HWPLUG_PLUGINS={hint}") in caplog.text

    monkeypatch.setenv("HWPLUG_PLUGINS", hint)  # as the message says
    fresh_discovery.reset()
    assert fresh_discovery.current_platform().name == "other"
    assert "stuck" not in _candidates(fresh_discovery)
    assert sys.modules[blocking_probe].calls == [1]  # not called again


def test_a_probe_timeout_is_an_error_in_strict_mode(site, fresh_discovery, blocking_probe,
                                                    monkeypatch):
    monkeypatch.setenv("HWPLUG_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="stuck: the probe of platform stuck did not answer "
                                          "within 0.6 s"):
        fresh_discovery.current_platform()


def test_a_slow_import_and_a_slow_hook_are_named_while_they_run(site, fresh_discovery,
                                                               monkeypatch, caplog):
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.4")
    add_platform(site, "slowimport", accel=False, plugin_src="import time\ntime.sleep(0.5)\n")
    add_platform(site, "slowhook", accel=False, plugin_src=(
        "import time\nfrom hwplug import hookimpl\n\n@hookimpl\n"
        "def hwplug_register_kernels(registry):\n    time.sleep(0.5)\n"))
    with caplog.at_level(logging.WARNING, logger="hwplug.discovery"):
        fresh_discovery.current_platform()
    assert "importing plugin slowimport is still running after 0.2 s; to skip it, allow " \
           "only the other plugins: HWPLUG_PLUGINS=" in caplog.text
    assert "hwplug_register_kernels of plugin slowhook is still running after 0.2 s" \
        in caplog.text
    records = _records(fresh_discovery)
    assert records["slowimport"].status == records["slowhook"].status == "loaded"
