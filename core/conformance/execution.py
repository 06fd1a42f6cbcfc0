"""Where a check's code actually ran, observed while it ran, never declared.

A numerical check runs the code under test inside :func:`observing` and records the torch
tensors it returned or wrote (:meth:`Observed.tensors`). The observation holds:

- the device types of those tensors (where the kernel's results live);
- how many Triton kernels Triton's interpreter launched (when ``TRITON_INTERPRET=1``,
  the interpreter's grid launches are counted while the check runs);
- whether the code is JAX code running on JAX's CPU backend (the code's distribution
  requires ``jax`` and ``jax.default_backend()`` is ``cpu``).

:func:`ran_on` turns the observation and the :class:`~hwplug.conformance.target.Placement`
(the platform's probe result: present and usable, or simulated) into the row's status:
``passed`` (checked on the platform's device: the placement simulates nothing, every
tensor is on its device type, no interpreter ran, and JAX code ran on JAX's CPU only for a
CPU platform) or ``simulated``, with what stood in
for the device: ``Triton interpreter``, ``JAX CPU`` or ``CPU stand-in`` (torch code on CPU
tensors, e.g. torch's CPU ``_scaled_mm`` standing in for cuBLASLt).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hwplug.conformance.result import Status

if TYPE_CHECKING:
    from hwplug.conformance.target import Placement

logger = logging.getLogger(__name__)

#: What stood in for the device, as :func:`ran_on` names it.
INTERPRETER, JAX_CPU, CPU_STAND_IN = "Triton interpreter", "JAX CPU", "CPU stand-in"


@dataclass
class Observed:
    """What one check's code did: the device types its tensors were on, and the Triton
    kernels the interpreter launched (see the module docstring)."""

    devices: set[str] = field(default_factory=set)
    launches: int = 0

    def tensors(self, *values: Any) -> None:
        """Record the device type of every tensor in ``values`` (inside tuples, lists,
        dicts too)."""
        for value in values:
            if isinstance(value, (tuple, list)):
                self.tensors(*value)
            elif isinstance(value, dict):
                self.tensors(*value.values())
            elif hasattr(value, "device") and hasattr(value, "dtype"):
                self.devices.add(value.device.type)


def interpreting() -> bool:
    """Whether Triton kernels defined from now on run in Triton's interpreter."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


@contextmanager
def observing() -> Iterator[Observed]:
    """Observe the code run inside: count the Triton interpreter's kernel launches (when
    ``TRITON_INTERPRET=1`` and triton is installed) and collect what the caller records."""
    observed = Observed()
    executor = None
    if interpreting() and importlib.util.find_spec("triton") is not None:
        executor = importlib.import_module("triton.runtime.interpreter").GridExecutor
    if executor is None:
        yield observed
        return
    launch = executor.__call__

    @functools.wraps(launch)
    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        observed.launches += 1
        return launch(self, *args, **kwargs)

    executor.__call__ = counted
    try:
        yield observed
    finally:
        executor.__call__ = launch


@functools.cache
def _requires(top_module: str, package: str) -> bool:
    """Whether the distribution providing ``top_module`` requires ``package``."""
    for dist in importlib.metadata.packages_distributions().get(top_module, ()):
        for requirement in importlib.metadata.requires(dist) or ():
            name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
            if name.lower() == package:
                return True
    return False


def _jax_on_cpu(module: str) -> bool:
    """Whether ``module``'s code is JAX code and JAX computes on its CPU backend here."""
    if "jax" not in sys.modules or not _requires(module.partition(".")[0], "jax"):
        return False
    return sys.modules["jax"].default_backend() == "cpu"


def ran_on(placement: Placement, observed: Observed, module: str) -> tuple[Status, str]:
    """``("passed", "")`` when the code (of ``module``) ran on the placement's device,
    else ``("simulated", what stood in for it)`` (see the module docstring)."""
    device = placement.device.partition(":")[0]
    platform = placement.platform
    # JAX on its CPU backend is the device only for a CPU placement (the default one, or a
    # CPU platform's; not a TPU platform whose probe took JAX's CPU as a stand-in)
    jax_stand_in = _jax_on_cpu(module) and not (platform is None
                                               or platform.matches(("cpu",)))
    if (not placement.simulating and not observed.launches and not jax_stand_in
            and observed.devices <= {device}):
        return "passed", ""
    if observed.launches:
        return "simulated", INTERPRETER
    if _jax_on_cpu(module):
        return "simulated", JAX_CPU
    return "simulated", CPU_STAND_IN
