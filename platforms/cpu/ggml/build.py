"""Build a C source into a shared library on first use, cached under ``HWPLUG_CACHE_DIR``.

The source is ``kernels.c`` of this package (:data:`SOURCE`) unless a caller names another
(the fused CPU kernels pass theirs). Two builds come from one source (:data:`BUILDS`):
``avx2`` (``-DHWPLUG_GGML_AVX2``, AVX2 + FMA + F16C, for x86-64 CPUs with them) and
``portable`` (plain C the compiler vectorizes, for every other CPU). The compiler is ``$CC``, else the one Python was built with
(``sysconfig``'s ``CC``), else ``cc``. Flags: ``-O3`` and the build's own, plus
``-march=native`` and ``-fopenmp`` where the compiler accepts them (a compiler that
rejects them builds without: a library without OpenMP runs on one thread).

The library lands at ``HWPLUG_CACHE_DIR/<source's folder>/<build>-<key>.so`` (``ggml``,
``fused``); the key hashes the source (and the headers beside it, which it includes),
the compiler (path, size, mtime), the flags and this CPU's identity (``-march=native``
code runs only on the CPU that built it), so a change to any of them builds anew. It is
written to a temporary file and renamed into place, so concurrent builders never expose
a half-written library. Anything that keeps the build from happening (no compiler, a
failing compiler, an unwritable cache) is an :class:`~hwplug.errors.UnsupportedError`
saying what, which the kernel registry reports as the variant's rejection reason.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hwplug import envs
from hwplug.errors import UnsupportedError

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
#: build name -> the flags that make it.
BUILDS: dict[str, tuple[str, ...]] = {
    "avx2": ("-DHWPLUG_GGML_AVX2", "-mavx2", "-mfma", "-mf16c"),
    "portable": (),
}
BASE_FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared")
#: Flags dropped, last first, while the compiler rejects them.
OPTIONAL_FLAGS = ("-fopenmp", "-march=native")
#: Seconds one compiler run may take.
COMPILE_TIMEOUT = 300


def compiler() -> tuple[list[str], str]:
    """The C compiler command and where it came from (``$CC``, ``sysconfig CC``, ``cc``).

    Raises :class:`UnsupportedError` when the chosen command is not an executable.
    """
    for origin, value in (("$CC", os.environ.get("CC")),
                          ("sysconfig CC", sysconfig.get_config_var("CC")), ("default", "cc")):
        if not value:
            continue
        argv = shlex.split(value)
        path = shutil.which(argv[0])
        if path is None:
            if origin == "sysconfig CC":
                continue  # Python's build machine had it; this one may not: try cc
            raise UnsupportedError(f"no C compiler to build the CPU kernels: "
                                   f"{argv[0]!r} (from {origin}) is not an executable; set CC "
                                   f"to a C compiler (gcc or clang)")
        return [path, *argv[1:]], origin
    raise AssertionError("unreachable: 'cc' is always tried")


def _cpu_identity() -> str:
    """The CPU model and feature flags as /proc/cpuinfo states them (else the arch)."""
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    keys = ("model name", "flags", "Features", "CPU part")
    wanted = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() in keys:
            wanted.setdefault(key.strip(), value.strip())
    return f"{platform.machine()} {sorted(wanted.items())}"


def cache_key(name: str, argv: list[str], source: Path | None = None) -> str:
    """Hash of everything the library's bytes depend on (see the module docstring)."""
    stat = Path(argv[0]).stat()
    source = source or SOURCE
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    parts = (source.read_bytes(), headers, repr(argv).encode(), f"{stat.st_size}:{stat.st_mtime_ns}".encode(),
             repr((BASE_FLAGS, BUILDS[name], OPTIONAL_FLAGS)).encode(), _cpu_identity().encode())
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:20]


def library_path(name: str, argv: list[str], source: Path | None = None) -> Path:
    """Where build ``name`` of ``source`` by compiler ``argv`` is (or will be) cached for
    this CPU."""
    source = source or SOURCE
    return (envs.HWPLUG_CACHE_DIR.expanduser() / source.parent.name
            / f"{name}-{cache_key(name, argv, source)}.so")


def _compile(argv: list[str], name: str, source: Path, target: Path) -> list[str]:
    """Compile into ``target`` with as many optional flags as the compiler takes; the flags
    used. Raises :class:`UnsupportedError` with the compiler's message when even the
    required flags fail."""
    optional = list(OPTIONAL_FLAGS)
    while True:
        flags = [*BASE_FLAGS, *BUILDS[name], *optional]
        try:
            done = subprocess.run([*argv, *flags, str(source), "-o", str(target)],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UnsupportedError(f"the C compiler {argv[0]} could not run: {exc}") from exc
        if done.returncode == 0:
            return flags
        if not optional:
            tail = (done.stderr or done.stdout).strip()[-600:]
            raise UnsupportedError(f"the C compiler {argv[0]} failed to build the "
                                   f"{source.parent.name} CPU kernels ({name}): exit "
                                   f"{done.returncode}: {tail}")
        logger.info("%s rejected %s; building without it", argv[0], optional[-1])
        optional.pop()


def build(name: str, source: Path | None = None) -> Path:
    """The path of build ``name`` of ``source`` (default :data:`SOURCE`), compiling it
    first unless it is cached."""
    if name not in BUILDS:
        raise UnsupportedError(f"unknown C kernel build {name!r}; known: {', '.join(BUILDS)}")
    source = source or SOURCE
    argv, origin = compiler()
    path = library_path(name, argv, source)
    if path.exists():
        return path
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=path.parent)
    except OSError as exc:
        raise UnsupportedError(f"cannot write the {source.parent.name} CPU kernels under "
                               f"{path.parent}: {exc}; set HWPLUG_CACHE_DIR to a writable "
                               f"directory") from exc
    os.close(handle)
    try:
        flags = _compile(argv, name, source, Path(temp))
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    logger.info("built %s (%s) with %s (from %s) %s into %s", source, name, argv[0], origin,
                " ".join(flags), path)
    return path


def load(name: str, source: Path | None = None) -> ctypes.CDLL:
    """Build ``name`` of ``source`` (default :data:`SOURCE`), built on first use, loaded
    through ctypes."""
    path = build(name, source)
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise UnsupportedError(f"the C kernels at {path} do not load: {exc}") from exc


class Library:
    """One build (``name``) of a C source, loaded on first use with its functions'
    ``argtypes`` set once. Subclasses set :attr:`source` and :attr:`signatures`."""

    source: Path = SOURCE
    #: C function name -> its ctypes argtypes.
    signatures: dict[str, list[Any]] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    @functools.cached_property
    def library(self) -> ctypes.CDLL:
        """The loaded library (built first if needed; :class:`UnsupportedError` if it cannot
        be)."""
        lib = load(self.name, self.source)
        for function, argtypes in self.signatures.items():
            getattr(lib, function).argtypes = argtypes
        return lib


class BuiltOp:
    """An op of a :class:`Library`, read as an attribute: the bound method ``_<attribute>``
    once the library is built, so asking for the op builds it and a failed build raises
    there, where the kernel registry turns it into the variant's rejection reason."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.method = f"_{name}"

    def __get__(self, instance: Library | None, owner: type) -> Callable[..., Any]:
        if instance is None:
            return self  # type: ignore[return-value]
        instance.library  # noqa: B018 - builds it
        return getattr(instance, self.method)
