"""A toy op for the kernel registry's tests: ``double(x) = 2x`` in a fresh registry, and
variants that answer with a constant, so a test sees which variant served a call."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwplug.kernel_registry import KernelRegistry

#: Exact tolerances: the variants' answers are compared as they are.
TOL = {"float32": (0.0, 0.0)}


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def tagged(tag: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A variant whose output is ``tag`` everywhere (shows it served the call)."""
    def impl(x: torch.Tensor) -> torch.Tensor:
        return torch.full_like(x, tag)
    return impl


def toy_registry() -> KernelRegistry:
    """A new registry declaring only ``double``."""
    registry = KernelRegistry()
    registry.define_op("double", double, doc="double(x) = 2x", tolerances=TOL)
    return registry
