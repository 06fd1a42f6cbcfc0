"""Building the ggml C kernels: the cache, the compiler's flags, and a broken compiler as the
variant's stated rejection reason (never a crash). tests/test_native_build.py has the build
step's status, remembered failures, the registry's use of them and ``hwplug build``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hwplug import current_platform
from hwplug.errors import BuildError, UnsupportedError
from hwplug.kernel_registry import KernelRegistry
from hwplug.kernel_registry.reference.ggml import ggml_linear
from hwplug.kernel_registry.reference.ggml_weights import ggml_weight
from hwplug.platforms.cpu.ggml import build, ops


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty HWPLUG_CACHE_DIR; returns where the libraries go."""
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path))
    return tmp_path / "ggml"


@pytest.fixture
def compiles(monkeypatch) -> list[list[str]]:
    """The compiler command lines run (subprocess.run, recorded and then run for real)."""
    seen: list[list[str]] = []
    real_run = subprocess.run

    def recording_run(argv, *args, **kwargs):
        seen.append(list(argv))
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", recording_run)
    return seen


REPO = Path(__file__).resolve().parents[1]


def test_a_wheel_ships_every_file_the_c_kernels_include():
    """A wheel holds the package data pyproject.toml names (an editable install reads the
    tree instead): each C source of the CPU kernels, and every header it includes, must be
    named there, or the build that includes the header fails where hwplug was installed from
    a wheel."""
    tomllib = pytest.importorskip("tomllib")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    sources = sorted((REPO / "platforms" / "cpu").glob("*/*.c"))
    assert sources
    for source in sources:
        patterns = data.get(f"hwplug.platforms.cpu.{source.parent.name}", [])
        shipped = {path.name for pattern in patterns for path in source.parent.glob(pattern)}
        included = {name for path in (source, *source.parent.glob("*.h"))
                    for name in re.findall(r'#include "([^"]+)"', path.read_text())}
        assert {source.name, *included} <= shipped, (source, patterns)


def quick_build() -> str:
    """The build that compiles faster here: avx2 where the CPU runs it, else portable."""
    features = current_platform().facts.features
    return "avx2" if {"x86_64", "avx2", "fma", "f16c"} <= features else "portable"


@pytest.mark.slow
def test_the_library_is_built_once_then_loaded_from_the_cache(cache, compiles):
    name = quick_build()
    built = build.build(name)
    path = built.path
    assert built.state == "built" and built.seconds > 0
    assert path.parent == cache and path.name.startswith(f"{name}-") and path.suffix == ".so"
    assert len(compiles) == 1 and "-O3" in compiles[0] and "-fopenmp" in compiles[0]
    assert sorted(p.name for p in cache.iterdir()) == [path.name]  # no temporary file left
    again = build.build(name)
    assert (again.path, again.seconds) == (path, None) and len(compiles) == 1  # cached
    assert build.load(name).hwplug_ggml_linear  # loads; its entry points are there


def test_the_cache_key_follows_the_source_and_the_compiler(cache, monkeypatch, tmp_path):
    argv, _ = build.compiler()
    key = build.cache_key("portable", argv)
    assert build.cache_key("avx2", argv) != key
    assert build.cache_key("portable", [*argv, "-g"]) != key
    edited = tmp_path / "kernels.c"
    edited.write_text(build.SOURCE.read_text())
    for shipped in build.SOURCE.parent.glob("*.h"):
        (tmp_path / shipped.name).write_text(shipped.read_text())
    header = tmp_path / "simd.h"
    assert build.cache_key("portable", argv, edited) == key  # the same source and headers
    header.write_text(header.read_text() + "\n/* edited */\n")
    assert build.cache_key("portable", argv, edited) != key  # a header it includes
    edited.write_text(build.SOURCE.read_text() + "\n/* edited */\n")
    monkeypatch.setattr(build, "SOURCE", edited)
    assert build.cache_key("portable", argv) != key


def wrapper(tmp_path: Path, body: str) -> str:
    """A compiler command: a shell script running ``body`` with the arguments in $@."""
    script = tmp_path / "cc-wrapper"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.slow
def test_flags_the_compiler_rejects_are_dropped(cache, compiles, monkeypatch, tmp_path):
    cc, _ = build.compiler()
    monkeypatch.setenv("CC", wrapper(tmp_path, 'case "$*" in *-march=native*) echo "cc1: error: '
                                               "bad value 'native' for -march= switch\" >&2; "
                                               f'exit 1;; esac\nexec {cc[0]} "$@"'))
    kernels = ops.GgmlKernels(quick_build())  # a build of its own, with the wrapper
    kernels.ensure_built()
    qweight = ggml_weight(torch.Generator().manual_seed(0), 8, 4, 64)  # Q8_0
    x = torch.randn(2, 64)
    out = kernels.linear(x, qweight, 8)
    assert ["-march=native" in argv for argv in compiles] == [True, False]  # retried without
    torch.testing.assert_close(out, ggml_linear(x, qweight, 8), atol=6e-2, rtol=1e-2)


@pytest.mark.parametrize("cc, reason", [
    ("/nonexistent/cc", r"no C compiler to build the CPU kernels: '/nonexistent/cc' "
                        r"\(from \$CC\) is not an executable"),
    ("false", r"the C compiler .*false failed to build the ggml CPU kernels \(portable\): "
              r"exit 1"),
])
def test_a_broken_compiler_is_a_typed_error_and_no_library(cache, monkeypatch, cc, reason):
    monkeypatch.setenv("CC", cc)
    with pytest.raises(BuildError, match=reason):
        build.build("portable")
    left = sorted(p.suffix for p in cache.iterdir()) if cache.exists() else []
    assert left in ([], [".failed"])  # nothing half-written; a compiler's failure remembered


def test_a_broken_compiler_is_the_variants_rejection_reason(cache, monkeypatch,
                                                              fresh_discovery):
    """Through the registry, as ``hwplug kernels`` shows it: the variant is rejected with
    the reason, and the reference serves."""
    monkeypatch.setenv("CC", "/nonexistent/cc")
    registry = KernelRegistry()
    registry.define_op("ggml_linear", "hwplug.kernel_registry.reference.ggml:ggml_linear",
                       doc="", tolerances={"float32": (6e-2, 1e-2)})
    registry.register_variant("ggml_linear", "ggml_c",
                              "hwplug.platforms.cpu.ggml.ops:PORTABLE.linear",
                              native="hwplug.platforms.cpu.ggml.ops:PORTABLE")
    why = registry.explain("ggml_linear", current_platform(), "cpu", "float32")
    assert why.chosen.name == "reference"
    assert why.rejected["ggml_c"].startswith("not built: no C compiler to build the CPU kernels")


def test_unknown_builds_are_named_with_the_known_ones():
    with pytest.raises(UnsupportedError, match="unknown C kernel build 'sse9'; known: avx2, "
                                               "vnni, portable"):
        build.build("sse9")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_kernels_share_torchs_openmp_runtime(fresh_discovery):
    """One OpenMP thread pool: a second libgomp would spin its own threads beside torch's."""
    ops.AVX2.ensure_built()  # built and loaded
    maps = Path("/proc/self/maps").read_text().splitlines()
    runtimes = {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line}
    assert len(runtimes) == 1, runtimes
