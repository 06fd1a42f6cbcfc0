"""``hwplug build``: build, ahead of time, the native kernel libraries this device can use.

Every native library (a kernel variant's ``native``) that a variant registered for the
current platform needs, where the device has the variant's features, is built unless it
is (the CPU's C kernels: the avx2 builds only on CPUs with AVX2, FMA and F16C). Each is
reported as already built (its path), built now (its path and seconds) or failed (the
reason; a failure is remembered, so running this again reports it without compiling until
``--force`` forgets it). It runs under ``HWPLUG_BUILD_KERNELS=never`` too: it is the step
that setting relies on (a Dockerfile's ``RUN hwplug build``). Exit status 0 when every
library is built; a :class:`~hwplug.errors.BuildError` (status 2) naming the failures
otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from hwplug.cli.output import add_json_flag, print_json, table
from hwplug.errors import BuildError, HwplugError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_json_flag(parser)
    parser.add_argument("--force", action="store_true",
                        help="forget remembered build failures first, so the compiler runs "
                             "again for them")


def collect(force: bool = False) -> dict[str, Any]:
    """Build each native library the current platform's variants need (see the module
    docstring); per library: ``library``, ``state`` (``already built``, ``built now`` or
    ``failed``), ``path``, ``seconds`` (built now), ``reason`` (failed) and the
    ``variants`` needing it."""
    from hwplug import kernels
    from hwplug.discovery import current_platform

    platform = current_platform()
    libraries = []
    for library, variants in kernels.native_libraries(platform):
        if force:
            library.forget_failure()
        try:
            built = library.ensure_built()
        except HwplugError as exc:
            status = library.status()
            libraries.append({"library": status.library, "state": "failed",
                              "path": status.path, "seconds": None, "reason": str(exc),
                              "variants": variants})
            continue
        libraries.append({"library": built.library, "path": built.path,
                          "state": "already built" if built.seconds is None else "built now",
                          "seconds": built.seconds, "reason": None, "variants": variants})
    return {"platform": platform.name, "libraries": libraries}


def run(args: argparse.Namespace, console: Console) -> int:
    data = collect(args.force)
    if args.json:
        print_json(console, data)
    else:
        rows = [(lib["library"], lib["state"],
                 lib["reason"] if lib["state"] == "failed" else lib["path"],
                 "" if lib["seconds"] is None else f"{lib['seconds']:.1f}",
                 ", ".join(lib["variants"])) for lib in data["libraries"]]
        console.print(table(f"native kernel libraries on platform {data['platform']}",
                            ("library", "state", "path (or why it failed)", "seconds",
                             "variants"), rows))
    failed = [lib for lib in data["libraries"] if lib["state"] == "failed"]
    if failed:
        raise BuildError(f"{len(failed)} of {len(data['libraries'])} native kernel libraries "
                         f"failed to build: "
                         + "; ".join(f"{lib['library']}: {lib['reason']}" for lib in failed))
    return 0
