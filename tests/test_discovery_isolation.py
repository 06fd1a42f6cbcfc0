"""Plugins that exit or hang: discovery isolates them and never hangs silently.

Each plugin is a real (temporary) distribution whose probe, import or hook calls
``sys.exit``, raises another BaseException, or blocks. ``HWPLUG_PROBE_TIMEOUT`` is set low so
the hanging cases take a fraction of a second; a blocked probe waits on an event the test
sets afterwards, releasing the thread it left behind. Hwplug's own probes are blocked the
way real hosts block them: a device file in a fake probe root is a FIFO nobody writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_dists import add_platform, good_plugin
from fake_hw import make_nvidia_tree, x86_cpuinfo

from hwplug import registries
from hwplug.discovery import state
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
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "1.2")  # half of it: 0.6 s
    add_platform(site, "slowimport", accel=False, plugin_src="import time\ntime.sleep(0.9)\n")
    add_platform(site, "slowhook", accel=False, plugin_src=(
        "import time\nfrom hwplug import hookimpl\n\n@hookimpl\n"
        "def hwplug_register_kernels(registry):\n    time.sleep(0.9)\n"))
    with caplog.at_level(logging.WARNING, logger="hwplug.discovery"):
        fresh_discovery.current_platform()
    assert "importing plugin slowimport is still running after 0.6 s; to skip it, allow " \
           "only the other plugins: HWPLUG_PLUGINS=" in caplog.text
    assert "hwplug_register_kernels of plugin slowhook is still running after 0.6 s" \
        in caplog.text
    records = _records(fresh_discovery)
    assert records["slowimport"].status == records["slowhook"].status == "loaded"


# --- hwplug's own probes reading a device file that blocks ----------------------------


def _blocking_file(root: Path, relpath: str) -> Path:
    """Replace ``root/relpath`` by a FIFO nobody writes: opening it for reading blocks."""
    path = root / relpath
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _release(fifo: Path) -> None:
    """Open ``fifo`` for writing and close it: every thread blocked opening it for reading
    goes on and reads an empty file (nothing happens where none is blocked)."""
    with contextlib.suppress(OSError):  # ENXIO: no reader is waiting
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.fixture
def blocked_nvidia_root(tmp_path):
    """A fake NVIDIA host whose driver version file (read by the NVIDIA probe) blocks."""
    make_nvidia_tree(tmp_path)
    fifo = _blocking_file(tmp_path, "proc/driver/nvidia/version")
    yield tmp_path
    _release(fifo)


def _discover_within(seconds: float, discovery):
    """``discovery.discover()`` run in a thread: its result, failing the test (instead of
    hanging it) when it has not answered within ``seconds``."""
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(value=discovery.discover()),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"discover() did not answer within {seconds} s"
    return outcome["value"]


def _probe_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("hwplug: ")}


def test_hwplug_info_answers_when_the_nvidia_driver_file_blocks(blocked_nvidia_root):
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS")}
    env.update(HWPLUG_PROBE_TIMEOUT="2", HWPLUG_PROBE_ROOT=str(blocked_nvidia_root),
               COLUMNS="500")  # one table row per line
    out = subprocess.run([sys.executable, "-m", "hwplug", "info"], capture_output=True,
                         text=True, env=env, timeout=10)
    assert out.returncode == 0, out.stderr
    timed_out = [line for line in out.stdout.splitlines() if "did not answer within 2 s" in line]
    assert timed_out and all("cuda" in line for line in timed_out), out.stdout


def test_a_blocked_probe_runs_once_per_discovery(blocked_nvidia_root, fresh_discovery,
                                                 monkeypatch):
    pytest.importorskip("hwplug_cuda")  # the cuda platform's probe is the NVIDIA one
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.5")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(blocked_nvidia_root))
    before = _probe_threads()
    resolution = _discover_within(5, fresh_discovery)
    assert resolution.platform.name == "cpu"
    cuda = next(c for c in resolution.candidates if c.name == "cuda")
    assert cuda.status == "failed"
    assert cuda.reason.startswith("the probe of platform cuda did not answer within 0.5 s")
    assert resolution.probe_timeouts == {}  # not run again for hardware without its plugin
    assert len(_probe_threads() - before) == 1  # the one thread it was left blocked in


def test_a_blocked_probe_of_hardware_without_its_plugin_is_reported(
        blocked_nvidia_root, fresh_discovery, monkeypatch):
    installed = state.entry_points
    monkeypatch.setattr(state, "entry_points", lambda group: [  # as if without hwplug-cuda
        ep for ep in installed(group) if ep.name != "cuda"])
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.5")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(blocked_nvidia_root))
    resolution = _discover_within(5, fresh_discovery)
    assert "cuda" not in {c.name for c in resolution.candidates}
    assert resolution.sightings == []
    assert resolution.probe_timeouts == {"cuda": (
        "the cuda hardware probe did not answer within 0.5 s (HWPLUG_PROBE_TIMEOUT) and was "
        "left running in a background thread")}


def test_a_blocked_cpu_probe_leaves_the_cpu_platform_without_its_sighting(
        tmp_path, fresh_discovery, monkeypatch):
    x86_cpuinfo(tmp_path, "avx2 fma")
    fifo = _blocking_file(tmp_path, "proc/cpuinfo")
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.5")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    try:
        resolution = _discover_within(5, fresh_discovery)
    finally:
        _release(fifo)
    assert (resolution.platform.name, resolution.platform.sighting) == ("cpu", None)
    cpu = next(c for c in resolution.candidates[1:] if c.name == "cpu")
    assert cpu.status == "failed"
    assert cpu.reason.startswith("the probe of platform cpu did not answer within 0.5 s")


#: A plugin whose import never returns (until the test releases it).
HANGING_IMPORT = """
import threading
RELEASE = threading.Event()
RELEASE.wait()
"""


def test_a_plugin_import_that_never_returns_is_abandoned(site, fresh_discovery, monkeypatch):
    monkeypatch.setenv("HWPLUG_PROBE_TIMEOUT", "0.6")
    module = site.module("hanging")
    site.add("acme-hanging", {"hwplug.plugins": {"hanging": module}}, {module: HANGING_IMPORT})
    add_platform(site, "fine", accel=False)
    try:
        resolution = _discover_within(5, fresh_discovery)
        records = {r.name: r for r in resolution.plugins}
        assert records["hanging"].status == "failed"
        assert records["hanging"].reason.startswith(
            "import abandoned: importing plugin hanging did not answer within 0.6 s")
        assert all(r.status != "failed" for name, r in records.items() if name != "hanging")
        assert resolution.platform.name == "fine"  # discovery carried on without it
    finally:  # the abandoned import holds its module's lock until it returns
        import_thread = [t for t in _probe_threads() if "importing plugin hanging" in t.name]
        for name, mod in list(sys.modules.items()):
            if name == module and hasattr(mod, "RELEASE"):
                mod.RELEASE.set()
        for thread in import_thread:
            thread.join(0)


def test_hwplug_info_answers_when_a_plugin_import_never_returns(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "hangs_forever.py").write_text("import time\ntime.sleep(3600)\n")
    info = site / "acme_hangs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-hangs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[hwplug.plugins]\nhangs = hangs_forever\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "HWPLUG_PLUGINS", "HWPLUG_STRICT_PLUGINS")}
    env.update(HWPLUG_PROBE_TIMEOUT="2", PYTHONPATH=str(site), COLUMNS="500")
    out = subprocess.run([sys.executable, "-m", "hwplug", "info"], capture_output=True,
                         text=True, env=env, timeout=20)
    assert out.returncode == 0, out.stderr
    assert any("hangs" in line and "import abandoned" in line
               for line in out.stdout.splitlines()), out.stdout
