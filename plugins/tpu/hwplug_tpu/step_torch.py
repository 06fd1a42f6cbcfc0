"""The torch calls a recorded step may make besides this plugin's ops, and what each is
recorded as (see :mod:`hwplug_tpu.step`): allocations and views pass (recomputed from
offset, shape and strides at replay); a dtype cast (``.float()``, ``.to(dtype)``, ...)
becomes a JAX cast, rows picked by an integer tensor a JAX gather, ``.contiguous()`` of a
strided view the view itself, and ``a + b`` of two tensors of one dtype a JAX sum. Any
other torch compute refuses the recording, naming the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
import torch

from hwplug.platforms.cpu.step_graph import OnlyAllocationsAndViews

if TYPE_CHECKING:
    from hwplug_tpu.step import Recording


#: Tensor methods that return a copy in another dtype, and that dtype (None: from the
#: arguments, see :func:`_cast_to`).
_CASTS = {"float": torch.float32, "double": torch.float64, "half": torch.float16,
          "bfloat16": torch.bfloat16, "to": None, "type_as": None}


def _cast_to(name: str, args: tuple, kwargs: dict) -> torch.dtype | None:
    """The dtype a call of tensor method ``name`` casts ``args[0]`` to, or None when it is
    no cast (or one to the same dtype)."""
    if name not in _CASTS or not args or not isinstance(args[0], torch.Tensor):
        return None
    dtype = _CASTS[name]
    if name == "to":
        given = [a for a in (*args[1:], kwargs.get("dtype")) if isinstance(a, torch.dtype)]
        dtype = given[0] if given else None
    elif name == "type_as" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        dtype = args[1].dtype
    return dtype if dtype is not None and dtype != args[0].dtype else None


def cast(x: jax.Array, *, dtype: str) -> jax.Array:
    """``x`` in ``dtype`` (a recorded torch cast)."""
    return x.astype(dtype)


def _row_index(args: tuple) -> bool:
    """Whether ``tensor[args[1]]`` picks rows by a 1-D integer tensor."""
    index = args[1] if len(args) == 2 else None
    return (isinstance(index, torch.Tensor) and index.dim() == 1
            and not index.dtype.is_floating_point and index.dtype != torch.bool)


def take_rows(x: jax.Array, rows: jax.Array) -> jax.Array:
    """Rows ``rows`` of ``x`` (a recorded ``x[rows]``)."""
    return x[rows]


def copy(x: jax.Array) -> jax.Array:
    """``x`` (a recorded ``.contiguous()`` of a strided view: the view, materialised)."""
    return x


def add(x: jax.Array, y: jax.Array) -> jax.Array:
    """``x + y`` (a recorded sum of two tensors of one dtype)."""
    return x + y


def _sum_of_two(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a call of ``name`` is ``a + b`` of two tensors of one dtype (a model's sum
    of two op outputs: DeepSeek's shared and routed experts)."""
    return (name in ("add", "__add__") and not kwargs and len(args) == 2
            and all(isinstance(a, torch.Tensor) for a in args)
            and args[0].dtype == args[1].dtype)


class AllocationsViewsAndCasts(OnlyAllocationsAndViews):
    """:class:`OnlyAllocationsAndViews` that records into ``recording`` dtype casts,
    ``.contiguous()`` copies of views and sums of two tensors of one dtype."""

    def __init__(self, recording: Recording) -> None:
        super().__init__(recording.tensors)
        self.recording = recording

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.__getitem__ and _row_index(args):  # a prefill's sampled rows
            return self.recording.call(take_rows, *args)
        name = getattr(func, "__name__", "")
        if name == "contiguous" and len(args) == 1 and not args[0].is_contiguous():
            return self.recording.call(copy, args[0])
        if _sum_of_two(name, args, kwargs):
            return self.recording.call(add, *args)
        dtype = _cast_to(name, args, kwargs)
        if dtype is None:
            return super().__torch_function__(func, types, args, kwargs)
        return self.recording.call(cast, args[0], dtype=str(dtype).removeprefix("torch."))
