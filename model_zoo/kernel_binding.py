"""How a layer binds the ops it calls: from its model's kernel plan, when it is built.

Every hwplug layer takes the model's :class:`~hwplug.model_zoo.context.ModelContext` and
binds each op it calls from ``ctx.kernels`` in its constructor, so the step calls bound
ops and nothing is chosen again. Layers written against the previous signature pass a
torch dtype where the context now goes: they still work, bound from the process's
default plan, with a deprecation warning (once per layer class) until the shim is
removed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from hwplug.dtypes import dtype_name
from hwplug.kernel_registry import kernels

if TYPE_CHECKING:
    from hwplug.attention import KernelBinder
    from hwplug.model_zoo.context import ModelContext

__all__ = ["bind", "kernels_of", "plan_and_dtype"]

_warned: set[str] = set()


def plan_and_dtype(ctx: ModelContext | torch.dtype | None, layer: str
                   ) -> tuple[KernelBinder, torch.dtype]:
    """What binds ``layer``'s ops and the dtype it computes in: the model's plan and dtype,
    or, given a torch dtype (or nothing) instead of the context, the default plan and that
    dtype (default float32), with a deprecation warning naming ``layer``."""
    if ctx is not None and not isinstance(ctx, torch.dtype):
        return ctx.kernels, ctx.dtype
    if layer not in _warned:
        _warned.add(layer)
        warnings.warn(f"{layer} was built without the model's context: its kernels come from "
                      "the process's default plan, not the model's; pass ctx (the "
                      "ModelContext) instead of a dtype", DeprecationWarning, stacklevel=3)
    return kernels.default_plan(), ctx or torch.float32


def bind(ctx: ModelContext | torch.dtype | None, layer: str, op: str,
         dtype: str | None = None) -> tuple[Callable[..., Any], torch.dtype]:
    """``op`` bound for ``layer`` (see :func:`plan_and_dtype`) for dispatch tensors of
    ``dtype`` (default: the layer's), and the layer's dtype."""
    plan, layer_dtype = plan_and_dtype(ctx, layer)
    return plan.bind(op, dtype or dtype_name(layer_dtype)), layer_dtype


def kernels_of(layer: torch.nn.Module) -> KernelBinder:
    """What binds the ops of a layer a quant method creates weights for: the plan its
    hwplug layer set (``layer.kernels``), else (a module built outside a model, e.g. by the
    conformance kit) the process's default plan."""
    plan = getattr(layer, "kernels", None)
    return plan if plan is not None else kernels.default_plan()
