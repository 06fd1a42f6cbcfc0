"""Native kernel libraries: compiled code a kernel variant calls, and where its build stands.

A variant whose implementation calls a library compiled on this machine (the CPU
platform's C kernels) names that library in :attr:`~hwplug.kernel_registry.variant.
Variant.native`, as data. The registry reads only :meth:`NativeLibrary.status` to explain
its choice (no compiler runs, nothing is written), and calls
:meth:`NativeLibrary.ensure_built` when it binds the variant for calls: the first call of a
dispatch key, and only while ``HWPLUG_BUILD_KERNELS`` is ``auto``; ``hwplug build`` calls
it ahead of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from hwplug import envs

#: ``built``: the library is there; ``failed``: it cannot be built (``reason`` says why,
#: without a compiler run); ``absent``: not built yet, the next :meth:`ensure_built` builds it.
BuildState = Literal["built", "failed", "absent"]
#: The note on an eligible variant whose library the first call builds.
BUILT_ON_FIRST_USE = "built on first use"
#: The rejection of a variant whose library is absent while runtime builds are off.
NOT_BUILT_NEVER = "not built (HWPLUG_BUILD_KERNELS=never): run `hwplug build`"


@dataclass(frozen=True)
class BuildStatus:
    """Where one native library stands.

    ``library`` names it for people (e.g. ``"ggml (avx2)"``). ``path`` is its file when
    built, else where it would be (None when not even that is known, e.g. no compiler).
    ``reason`` says why a ``failed`` library cannot be built. ``seconds`` is how long
    :meth:`NativeLibrary.ensure_built` took to build it just now; None when it was built
    before.
    """

    library: str
    state: BuildState
    path: Path | None = None
    reason: str | None = None
    seconds: float | None = None


@runtime_checkable
class NativeLibrary(Protocol):
    """What :attr:`Variant.native` names (a lazy ``"module:attribute"`` of such an object).

    A variant whose code calls into several libraries names one object standing for all of
    them (building and loading each), which lists them in a ``parts`` attribute: ``hwplug
    build`` and :meth:`~hwplug.kernel_registry.registry.KernelRegistry.native_libraries`
    then report each part once, not the whole."""

    def status(self) -> BuildStatus:
        """Where the build stands, without side effects: no compiler runs, no file is
        written (reading the source and the compiler's identity is fine)."""

    def ensure_built(self) -> BuildStatus:
        """Build the library unless it is built (a ``built`` status, with ``seconds`` when it
        was built now) and load it. Raises :class:`~hwplug.errors.BuildError` with the
        reason when it cannot be built; a failure is remembered, so later calls (in this
        process or another) raise it again without running the compiler."""

    def forget_failure(self) -> bool:
        """Forget a remembered build failure, so the next :meth:`ensure_built` runs the
        compiler again; whether there was one."""


def explain_build(library: NativeLibrary) -> tuple[str | None, str | None]:
    """(why a variant needing ``library`` is rejected, a note on it), from the library's
    status alone: built -> neither; failed -> ``"not built: <reason>"``; absent -> the note
    :data:`BUILT_ON_FIRST_USE`, or the rejection :data:`NOT_BUILT_NEVER` while
    ``HWPLUG_BUILD_KERNELS=never``."""
    status = library.status()
    if status.state == "built":
        return None, None
    if status.state == "failed":
        return f"not built: {status.reason}", None
    if envs.HWPLUG_BUILD_KERNELS == "never":
        return NOT_BUILT_NEVER, None
    return None, BUILT_ON_FIRST_USE
