"""Replaying a recorded model step: a capability a platform may have.

A platform that can run a step again without re-running its Python (the CPU platform
records the native kernel calls a decode step makes; a GPU platform could capture a CUDA
graph) returns a :class:`StepRecorder` from :meth:`hwplug.Platform.step_recorder`. The
engine then records each decode batch size once and replays it; on a platform that
returns None (the default) every step runs eagerly and nothing is ever recorded.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol


class RecordedStep(Protocol):
    """One recorded step. The recorder's caller sets :attr:`outputs` to what the recorded
    step returned; :meth:`replay` runs the step again over the same input and output
    memory and returns :attr:`outputs`, now holding this run's results."""

    outputs: Any

    def replay(self) -> Any: ...


class StepRecorder(Protocol):
    """How a platform records and replays steps (see the module docstring)."""

    #: What is recorded, for reports (``"native kernel calls"``).
    name: str

    def record(self) -> AbstractContextManager[RecordedStep]:
        """Record what the code run inside the block does into the yielded step. Raises
        :class:`~hwplug.errors.UnsupportedError` naming why when that code did something a
        replay would not repeat."""
        ...

    def check_same(self, first: RecordedStep, second: RecordedStep) -> None:
        """Raise :class:`~hwplug.errors.UnsupportedError` unless two recordings of the same
        step over different input contents did the same thing (else what the step does
        depends on the data, which a replay would not follow)."""
        ...
