"""The native build step: a library's status (no side effects), ``ensure_built`` (a failure
remembered beside where the library would be), the registry explaining from the status and
building only when it binds a variant, ``HWPLUG_BUILD_KERNELS`` and ``hwplug build``.

The subprocess tests run hwplug as a user does, with ``CC`` a compiler that logs each run
and fails, so the log counts the compiler runs."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwplug.errors import BuildError, UnsupportedError
from hwplug.kernel_registry import KernelRegistry
from hwplug.kernel_registry.native import (
    BUILT_ON_FIRST_USE,
    NOT_BUILT_NEVER,
    BuildStatus,
    NativeLibrary,
)
from hwplug.platforms.cpu.ggml import ops as ggml_ops
from hwplug.platforms.cpu.platform import CpuPlatform

HWPLUG = [sys.executable, "-m", "hwplug"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty HWPLUG_CACHE_DIR."""
    path = tmp_path / "cache"
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(path))
    return path


def compiler(tmp_path: Path, name: str = "failing-cc") -> tuple[Path, Path]:
    """A compiler that appends its arguments to a log and fails: (its path, the log)."""
    log, script = tmp_path / f"{name}.log", tmp_path / name
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexit 1\n')
    script.chmod(0o755)
    return script, log


@pytest.fixture
def failing_cc(tmp_path, monkeypatch) -> Path:
    """CC set to :func:`compiler`'s script; returns its log."""
    script, log = compiler(tmp_path)
    monkeypatch.setenv("CC", str(script))
    return log


def runs(log: Path) -> list[str]:
    """The compiler runs a log recorded."""
    return log.read_text().splitlines() if log.exists() else []


def builds_run(log: Path) -> dict[tuple[str, str], int]:
    """Compiler runs per build: (source folder, build name) -> count."""
    counts: dict[tuple[str, str], int] = {}
    for line in runs(log):
        folder = ("ggml" if "/ggml/kernels.c" in line
                  else "fused_moe" if "/fused_moe/kernels.c" in line else "fused")
        build = (folder, "vnni" if "-DHWPLUG_GGML_VNNI" in line
                 else "avx2" if "-DHWPLUG_GGML_AVX2" in line else "portable")
        counts[build] = counts.get(build, 0) + 1
    return counts


def test_status_has_no_side_effects_and_a_failure_is_remembered(cache, failing_cc, tmp_path,
                                                                 monkeypatch):
    library = ggml_ops.GgmlKernels("portable")  # one of its own: nothing loaded yet
    assert isinstance(library, NativeLibrary)
    before = library.status()
    assert (before.state, before.library) == ("absent", "ggml (portable)")
    assert before.path.parent == cache / "ggml" and not cache.exists() and not runs(failing_cc)
    with pytest.raises(UnsupportedError, match=r"not built: build it first"):
        library.library  # noqa: B018 - loading never builds
    message = (r"the C compiler .*failing-cc failed to build the ggml CPU kernels \(portable\): "
               r"exit 1: \(no message\)")
    with pytest.raises(BuildError, match=message):
        library.ensure_built()
    assert len(runs(failing_cc)) == 1  # its message blames no optional flag: no retry
    failed = before.path.with_suffix(".failed")
    assert [p.name for p in (cache / "ggml").iterdir()] == [failed.name]  # no temporary file
    after = library.status()
    assert after.state == "failed" and f"remembered in {failed}" in after.reason
    with pytest.raises(BuildError, match=message + ".*remembered"):
        library.ensure_built()
    assert len(runs(failing_cc)) == 1  # remembered: the compiler does not run again
    other, other_log = compiler(tmp_path, "other-cc")
    monkeypatch.setenv("CC", str(other))
    assert library.status().state == "absent"  # another compiler: another key
    monkeypatch.setenv("CC", str(tmp_path / "failing-cc"))
    assert library.forget_failure() and not library.forget_failure()
    assert library.status().state == "absent"
    with pytest.raises(BuildError):
        library.ensure_built()
    assert len(runs(failing_cc)) == 2 and not runs(other_log)


def test_no_compiler_is_a_failed_status_without_a_file(cache, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    status = ggml_ops.GgmlKernels("portable").status()
    assert status.state == "failed" and status.path is None
    assert status.reason.startswith("no C compiler to build the CPU kernels")


class FakeLibrary:
    """A :class:`NativeLibrary` in memory: ``state`` until built; ``fails`` is the build's
    error; ``builds`` counts the builds :meth:`ensure_built` ran (not finding it built)."""

    def __init__(self, state: str = "absent", fails: str | None = None) -> None:
        self.state, self.fails, self.builds = state, fails, 0

    def status(self) -> BuildStatus:
        return BuildStatus("fake", self.state, reason=self.fails if self.state == "failed"
                           else None)

    def ensure_built(self) -> BuildStatus:
        if self.state == "built":
            return BuildStatus("fake", "built")
        self.builds += 1
        if self.fails:
            self.state = "failed"
            raise BuildError(self.fails)
        self.state = "built"
        return BuildStatus("fake", "built", seconds=0.1)

    def forget_failure(self) -> bool:
        return False


def tagged(tag: float):
    def impl(x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, tag)
    return impl


@pytest.fixture
def reg(fresh_discovery) -> KernelRegistry:
    registry = KernelRegistry()
    registry.define_op("double", lambda x: x * 2, doc="double(x) = 2x",
                       tolerances={"float32": (0.0, 0.0)})
    return registry


def test_explain_reads_the_status_only(reg, monkeypatch):
    libraries = {"absent": FakeLibrary(), "failed": FakeLibrary("failed", "cc: exit 1"),
                 "built": FakeLibrary("built")}
    for priority, (name, library) in enumerate(libraries.items()):
        reg.register_variant("double", name, tagged(priority), priority=priority + 1,
                             native=library)
    why = reg.explain("double", CpuPlatform(), "cpu", "float32")
    assert [v.name for v in why.chain] == ["built", "absent", "reference"]
    assert why.notes == {"absent": BUILT_ON_FIRST_USE}
    assert why.rejected == {"failed": "not built: cc: exit 1"}
    monkeypatch.setenv("HWPLUG_BUILD_KERNELS", "never")
    why = reg.explain("double", CpuPlatform(), "cpu", "float32")
    assert [v.name for v in why.chain] == ["built", "reference"]
    assert why.rejected["absent"] == NOT_BUILT_NEVER
    assert sum(lib.builds for lib in libraries.values()) == 0


def test_binding_builds_and_a_failed_build_falls_back_with_one_warning(reg, caplog):
    broken, fine = FakeLibrary(fails="cc: exit 1"), FakeLibrary()
    reg.register_variant("double", "broken", tagged(9.0), priority=9, native=broken)
    reg.register_variant("double", "fine", tagged(5.0), priority=5, native=fine)
    op = reg.op("double")
    with caplog.at_level(logging.WARNING, logger="hwplug.kernel_registry.dispatch"):
        assert op(torch.zeros(2)).tolist() == [5.0, 5.0]
        op(torch.zeros(2, dtype=torch.float64))  # a second key: broken's failure remembered
    assert (broken.builds, fine.builds) == (1, 1)
    warnings = [r.message for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["kernel variant double/broken is not used: not built: cc: exit 1"]


def test_a_fallback_is_built_when_it_first_accepts_a_call(reg):
    first, second = FakeLibrary(), FakeLibrary(fails="cc: exit 1")
    reg.register_variant("double", "even", tagged(4.0), priority=9, native=first,
                         supports=lambda x: None if x.shape[0] % 2 == 0 else "odd length")
    reg.register_variant("double", "any", tagged(3.0), priority=5, native=second,
                         supports=lambda x: None)
    op = reg.op("double")
    assert op(torch.zeros(2)).tolist() == [4.0, 4.0]
    assert (first.builds, second.builds) == (1, 0)  # nothing built before it serves
    assert op(torch.ones(3)).tolist() == [2.0] * 3  # "any" failed to build: the reference
    assert op(torch.ones(5)).tolist() == [2.0] * 5 and second.builds == 1
    assert op.variants_used() == {"even", "reference"}


def hwplug(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*HWPLUG, *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400", **env}, timeout=300)


@pytest.mark.slow
def test_a_failing_compiler_runs_at_most_once_per_build(tmp_path):
    script, log = compiler(tmp_path)
    env = {"CC": str(script), "HWPLUG_CACHE_DIR": str(tmp_path / "cache")}
    table = hwplug("kernels", env=env)
    assert table.returncode == 0, table.stderr
    assert "fused_c (built on first use)" in table.stdout
    data = json.loads(hwplug("kernels", "--json", "--op", "rms_norm", env=env).stdout)
    assert data["ops"]["rms_norm"]["float32"]["notes"]["fused_c"] == BUILT_ON_FIRST_USE
    assert "(built on first use)" in hwplug("kernels", "--op", "ggml_linear", env=env).stdout
    assert runs(log) == []  # explaining runs no compiler
    out = hwplug("generate", "Hello", "--max-tokens", "4", "--dtype", "float32", env=env)
    assert out.returncode == 0, out.stderr
    assert "kernel variant rms_norm/fused_c is not used: not built: the C compiler" in out.stderr
    assert set(builds_run(log).values()) == {1}  # each build tried once, fused and ggml alike
    assert {folder for folder, _ in builds_run(log)} == {"ggml", "fused"}
    data = json.loads(hwplug("kernels", "--json", "--op", "rms_norm", "--op", "ggml_linear",
                             env=env).stdout)["ops"]
    for op in ("rms_norm", "ggml_linear"):
        reason = data[op]["float32"]["rejected"]["fused_c" if op == "rms_norm" else "ggml_c"]
        assert reason.startswith("not built: the C compiler") and "remembered in" in reason
    assert set(builds_run(log).values()) == {1}


@pytest.mark.slow
def test_never_runs_no_compiler_and_the_fallbacks_serve(tmp_path):
    script, log = compiler(tmp_path)
    env = {"CC": str(script), "HWPLUG_CACHE_DIR": str(tmp_path / "cache"),
           "HWPLUG_BUILD_KERNELS": "never"}
    data = json.loads(hwplug("kernels", "--json", "--op", "rms_norm", env=env).stdout)
    why = data["ops"]["rms_norm"]["float32"]
    assert why["rejected"]["fused_c"] == NOT_BUILT_NEVER and why["chosen"] == "torch_fused"
    out = hwplug("generate", "Hello", "--max-tokens", "4", "--dtype", "float32", env=env)
    assert out.returncode == 0, out.stderr
    assert "rms_norm=torch_fused" in out.stderr and runs(log) == []


@pytest.mark.slow
def test_hwplug_build_builds_and_reports_what_is_already_built(tmp_path):
    env = {"HWPLUG_CACHE_DIR": str(tmp_path / "cache"), "HWPLUG_BUILD_KERNELS": "never"}
    first = hwplug("build", "--json", env=env)
    assert first.returncode == 0, first.stderr
    libraries = json.loads(first.stdout)["libraries"]
    names = {lib["library"] for lib in libraries}
    assert {"ggml (portable)", "fused (portable)"} <= names
    assert all(lib["state"] == "built now" and Path(lib["path"]).exists() for lib in libraries)
    assert "rms_norm/fused_c" in {v for lib in libraries for v in lib["variants"]}
    second = json.loads(hwplug("build", "--json", env=env).stdout)["libraries"]
    assert [(lib["library"], lib["state"]) for lib in second] == [
        (name["library"], "already built") for name in libraries]
    table = hwplug("build", env=env)
    assert table.returncode == 0 and "already built" in table.stdout
    why = json.loads(hwplug("kernels", "--json", "--op", "rms_norm", env=env).stdout)
    assert why["ops"]["rms_norm"]["float32"]["chosen"].startswith("fused_")  # under never


def test_hwplug_build_with_a_failing_compiler_exits_2_and_remembers(tmp_path):
    script, log = compiler(tmp_path)
    env = {"CC": str(script), "HWPLUG_CACHE_DIR": str(tmp_path / "cache"),
           "HWPLUG_BUILD_KERNELS": "never"}
    failed = hwplug("build", "--json", env=env)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    libraries = json.loads(failed.stdout)["libraries"]
    assert {lib["state"] for lib in libraries} == {"failed"}
    assert f"BuildError: {len(libraries)} of {len(libraries)} native kernel libraries failed" \
           in failed.stderr and "failing-cc failed to build the ggml CPU kernels" in failed.stderr
    assert sorted(builds_run(log).items()) == sorted(
        ((lib["library"].split()[0], lib["library"].split()[1].strip("()")), 1)
        for lib in libraries)  # one compiler run per build
    again = hwplug("build", env=env)
    assert again.returncode == 2 and "remembered in" in again.stderr
    assert len(runs(log)) == len(libraries)  # remembered: no compiler run
    assert hwplug("build", "--force", env=env).returncode == 2
    assert len(runs(log)) == 2 * len(libraries)
