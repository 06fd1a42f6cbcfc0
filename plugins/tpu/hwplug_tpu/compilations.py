"""How many XLA compilations this process has made, and how long they took.

JAX reports every backend compilation as a ``jax.monitoring`` duration event; a listener
installed on first use counts them. The ops of this plugin are jitted per shape bucket,
so the count grows while new buckets are met and then stays put: ``hwplug generate``
prints it (:meth:`hwplug_tpu.platform.TpuPlatform.execution_summary`), and a count that
grows with every step would show a shape that is not bucketed.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

#: The event JAX records around each XLA backend compilation (``jax._src.dispatch``).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@dataclass
class Compilations:
    """Running totals: ``count`` compilations taking ``seconds`` in all."""

    count: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def record(self, event: str, duration: float, **_: Any) -> None:
        """A ``jax.monitoring`` duration listener: counts :data:`COMPILE_EVENT` events."""
        if event == COMPILE_EVENT:
            with self._lock:
                self.count += 1
                self.seconds += duration

    def describe(self) -> str:
        """``"jax: 12 XLA compilations (3.4 s)"``."""
        plural = "" if self.count == 1 else "s"
        return f"jax: {self.count} XLA compilation{plural} ({self.seconds:.1f} s)"


@functools.cache
def compilations() -> Compilations:
    """The process's totals; the first call installs the listener (and imports jax)."""
    import jax

    totals = Compilations()
    jax.monitoring.register_event_duration_secs_listener(totals.record)
    return totals
