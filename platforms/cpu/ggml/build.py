"""Build a C source into a shared library, cached under ``HWPLUG_CACHE_DIR``, as an explicit
step: :meth:`Library.ensure_built` (which the kernel registry calls when it binds a variant
for calls, and ``hwplug build`` ahead of time); :meth:`Library.status` says where a build
stands without running anything.

The source is ``kernels.c`` of this package (:data:`SOURCE`) unless a caller names another
(the fused CPU kernels pass theirs). The builds of one source (:data:`BUILDS`):
``avx2`` (``-DHWPLUG_GGML_AVX2``, AVX2 + FMA + F16C, for x86-64 CPUs with them),
``vnni`` (the GGUF kernels' ``avx2`` build whose int8 dot products use AVX-512 VNNI on
256-bit vectors, and on 512-bit ones for several activation rows of the super-block types,
``-DHWPLUG_GGML_VNNI``, for CPUs with AVX512-VNNI, AVX512-BW and AVX512-VL) and
``portable`` (plain C the compiler vectorizes, for every other CPU). The compiler is
``$CC``, else the one Python was built with (``sysconfig``'s ``CC``), else ``cc``. Flags:
``-O3`` and the build's own, plus ``-march=native`` and ``-fopenmp``
(:data:`OPTIONAL_FLAGS`): a compiler whose error message names one of those is run again
without it (a library without OpenMP runs on one thread); any other failure ends the build
after one compiler run.

The library lands at ``HWPLUG_CACHE_DIR/<source's folder>/<build>-<key>.so`` (``ggml``,
``fused``); the key hashes the source (and the headers beside it, which it includes),
the compiler (path, size, mtime), the flags and this CPU's identity (``-march=native``
code runs only on the CPU that built it), so a change to any of them builds anew. It is
written to a temporary file and renamed into place, so concurrent builders never expose
a half-written library. A failed compilation is remembered beside it, in
``<build>-<key>.failed`` (the compiler's message, written the same way), so later calls and
processes report it without running the compiler until the key changes or
:meth:`Library.forget_failure` (``hwplug build --force``) drops it. Anything that keeps the
build from happening (no compiler, a failing compiler, an unwritable cache) is a
:class:`~hwplug.errors.BuildError` saying what, which the kernel registry reports as the
variant's rejection reason.
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
import time
from pathlib import Path
from typing import Any

from hwplug import envs
from hwplug.errors import BuildError, UnsupportedError
from hwplug.kernel_registry.native import BuildStatus

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.c")
#: build name -> the flags that make it.
BUILDS: dict[str, tuple[str, ...]] = {
    "avx2": ("-DHWPLUG_GGML_AVX2", "-mavx2", "-mfma", "-mf16c"),
    "vnni": ("-DHWPLUG_GGML_AVX2", "-DHWPLUG_GGML_VNNI", "-mavx2", "-mfma", "-mf16c",
             "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
    "portable": (),
}
BASE_FLAGS = ("-O3", "-std=c11", "-fPIC", "-shared")
#: Flags the build does without where the compiler rejects them -> words (lower case) of a
#: compiler message that blame the flag: gcc's "unrecognized command-line option" or "bad
#: value 'native' for -march=", clang's "unsupported option '-fopenmp'", a missing omp.h or
#: libgomp.
OPTIONAL_FLAGS: dict[str, tuple[str, ...]] = {
    "-fopenmp": ("openmp", "omp.h", "gomp", "libomp", "iomp"),
    "-march=native": ("march", "target cpu", "target-cpu"),
}
#: Seconds one compiler run may take.
COMPILE_TIMEOUT = 300


def compiler() -> tuple[list[str], str]:
    """The C compiler command and where it came from (``$CC``, ``sysconfig CC``, ``cc``).

    Raises :class:`BuildError` when the chosen command is not an executable.
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
            raise BuildError(f"no C compiler to build the CPU kernels: {argv[0]!r} (from "
                             f"{origin}) is not an executable; set CC to a C compiler (gcc or "
                             f"clang)")
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
    flags = (BASE_FLAGS, BUILDS[name], tuple(OPTIONAL_FLAGS))
    parts = (source.read_bytes(), headers, repr(argv).encode(),
             f"{stat.st_size}:{stat.st_mtime_ns}".encode(), repr(flags).encode(),
             _cpu_identity().encode())
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
    """Compile into ``target``; the flags used. A failure whose message names optional
    flags is retried without them; any other raises :class:`BuildError` with the compiler's
    message."""
    optional = list(OPTIONAL_FLAGS)
    while True:
        flags = [*BASE_FLAGS, *BUILDS[name], *optional]
        try:
            done = subprocess.run([*argv, *flags, str(source), "-o", str(target)],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"the C compiler {argv[0]} could not run: {exc}") from exc
        if done.returncode == 0:
            return flags
        message = (done.stderr or done.stdout).strip()
        blamed = [flag for flag in optional
                  if any(word in message.lower() for word in OPTIONAL_FLAGS[flag])]
        if not blamed:
            raise BuildError(f"the C compiler {argv[0]} failed to build {_what(name, source)}: "
                             f"exit {done.returncode}: {message[-600:] or '(no message)'}")
        logger.info("%s rejected %s; building without it", argv[0], " ".join(blamed))
        optional = [flag for flag in optional if flag not in blamed]


def _label(name: str, source: Path) -> str:
    """How a build is named in a table: ``"ggml (avx2)"``."""
    return f"{source.parent.name} ({name})"


def _what(name: str, source: Path) -> str:
    """How a build is named in a message: ``"the ggml CPU kernels (avx2)"``."""
    return f"the {source.parent.name} CPU kernels ({name})"


def _known(name: str) -> None:
    if name not in BUILDS:
        raise UnsupportedError(f"unknown C kernel build {name!r}; known: {', '.join(BUILDS)}")


def status(name: str, source: Path | None = None) -> BuildStatus:
    """Where build ``name`` of ``source`` (default :data:`SOURCE`) stands for this compiler
    and CPU: built (its path), failed (no compiler, or the remembered compiler's message),
    or absent (where it would be). Runs nothing and writes nothing."""
    _known(name)
    source = source or SOURCE
    label = _label(name, source)
    try:
        argv, _ = compiler()
    except BuildError as exc:
        return BuildStatus(label, "failed", reason=str(exc))
    path = library_path(name, argv, source)
    if path.exists():
        return BuildStatus(label, "built", path)
    failed = path.with_suffix(".failed")
    if not failed.exists():
        return BuildStatus(label, "absent", path)
    try:
        message = failed.read_text(encoding="utf-8", errors="replace").strip()
    except OSError as exc:
        message = f"a failed build whose message cannot be read: {exc}"
    return BuildStatus(label, "failed", path, f"{message} (remembered in {failed}; "
                                              f"`hwplug build --force` retries)")


def build(name: str, source: Path | None = None) -> BuildStatus:
    """Build ``name`` of ``source`` (default :data:`SOURCE`) unless it is built: its
    ``built`` status, with the seconds it took when it was built now (logged at INFO with
    the compiler and flags). Raises :class:`BuildError`: no compiler, an unwritable cache,
    a failing compiler (remembered, see the module docstring) or a remembered failure
    (raised again without running the compiler)."""
    current = status(name, source)
    if current.state == "built":
        return current
    if current.state == "failed":
        raise BuildError(current.reason)
    source, path = source or SOURCE, current.path
    argv, origin = compiler()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=path.parent)
    except OSError as exc:
        raise BuildError(f"cannot write {_what(name, source)} under "
                         f"{path.parent}: {exc}; set HWPLUG_CACHE_DIR to a writable "
                         f"directory") from exc
    os.close(handle)
    started = time.perf_counter()
    try:
        flags = _compile(argv, name, source, Path(temp))
        os.replace(temp, path)
    except BuildError as exc:
        _remember(path.with_suffix(".failed"), str(exc))
        raise
    finally:
        if os.path.exists(temp):
            os.unlink(temp)
    seconds = time.perf_counter() - started
    logger.info("built %s in %.1f s with %s (from %s) %s into %s", _what(name, source),
                seconds, argv[0], origin, " ".join(flags), path)
    return BuildStatus(current.library, "built", path, seconds=seconds)


def _remember(failed: Path, message: str) -> None:
    """Write a build's failure ``message`` to ``failed`` (a temporary file renamed into
    place); a cache that takes no file only loses the memory of it (logged)."""
    temp = None
    try:
        handle, temp = tempfile.mkstemp(prefix=f".{failed.stem}-", suffix=".failed",
                                        dir=failed.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(message + "\n")
        os.chmod(temp, 0o644)  # mkstemp's 0600 would hide it from other users of the cache
        os.replace(temp, failed)
    except OSError as exc:
        logger.warning("could not remember the failed build in %s: %s", failed, exc)
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)


def forget_failure(name: str, source: Path | None = None) -> bool:
    """Delete the remembered failure of ``name`` of ``source`` for this compiler and CPU, so
    the next :func:`build` runs the compiler; whether there was one."""
    current = status(name, source)
    if current.state != "failed" or current.path is None:
        return False
    current.path.with_suffix(".failed").unlink(missing_ok=True)
    return True


def load(name: str, source: Path | None = None) -> ctypes.CDLL:
    """Build ``name`` of ``source`` (default :data:`SOURCE`) as built before, loaded through
    ctypes. Builds nothing: raises :class:`UnsupportedError` when it is not built
    (:func:`build` first) or does not load."""
    source = source or SOURCE
    current = status(name, source)
    if current.state != "built":
        why = current.reason or "build it first (Library.ensure_built(), or `hwplug build`)"
        raise UnsupportedError(f"{_what(name, source)} are not built: {why}")
    try:
        return ctypes.CDLL(str(current.path))
    except OSError as exc:
        raise UnsupportedError(f"the C kernels at {current.path} do not load: {exc}") from exc


class Library:
    """One build (``name``) of a C source, a :class:`~hwplug.kernel_registry.native.
    NativeLibrary`: :meth:`status`, :meth:`ensure_built` (builds and loads it, the only way
    it is built) and :meth:`forget_failure`. Subclasses set :attr:`source` and
    :attr:`signatures`; their ops call the functions of :attr:`library`, so a call is one
    ctypes call once the library is loaded."""

    source: Path = SOURCE
    #: C function name -> its ctypes argtypes.
    signatures: dict[str, list[Any]] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def status(self) -> BuildStatus:
        """Where this build stands (see :func:`status`): no side effects."""
        return status(self.name, self.source)

    def ensure_built(self) -> BuildStatus:
        """Build this library unless it is built (see :func:`build`), then load it."""
        built = build(self.name, self.source)
        self.library  # noqa: B018 - loaded once, its argtypes set
        return built

    def forget_failure(self) -> bool:
        """Forget a remembered failed build (see :func:`forget_failure`)."""
        return forget_failure(self.name, self.source)

    @functools.cached_property
    def library(self) -> ctypes.CDLL:
        """The loaded library, its functions' argtypes set once. Loading builds nothing:
        :class:`UnsupportedError` until :meth:`ensure_built` (or ``hwplug build``) has built
        it."""
        lib = load(self.name, self.source)
        for function, argtypes in self.signatures.items():
            getattr(lib, function).argtypes = argtypes
        return lib
