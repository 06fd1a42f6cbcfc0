"""Step graphs: a model step recorded as the native calls its kernels make, replayed
without Python.

Kernels that call C through ctypes make each call through :func:`native_call`. Inside
:func:`record`, every such call is kept instead of made, with its arguments (pointers,
sizes, thread counts) as they were, and a :class:`StepGraph` replays the list: the same
C functions on the same memory, none of the Python around them (module calls, dispatch,
``supports`` checks, allocation). As with CUDA graphs, the step's inputs must sit in the
same tensors at every replay (static buffers the caller refills), and the outputs are
the tensors the recorded step returned, written by each replay: nothing computes while
recording (no Python may read what a kernel wrote, see below), so a recording costs the
step's Python, not its kernels, and the outputs hold results from the first replay on.

A recording is refused (:class:`~hwplug.errors.UnsupportedError`, naming the cause) when
the step did anything a replay would not repeat: a torch function that computes, writes
in place or reads a tensor's contents into Python (only allocations, metadata reads and
views of existing tensors may run; checked by a ``TorchFunctionMode`` while recording, as
a ``TorchDispatchMode`` would import torch._dynamo, a second's start), or no native call
at all. The tensors allocated while recording stay
alive with the graph, so the recorded pointers stay valid. :func:`same_calls` compares
two recordings of the same step over different input contents: an argument that differs
(beyond where the recordings' own allocations lie) depends on the data, not the shapes,
and a replay would repeat a stale value.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from hwplug.errors import UnsupportedError

#: Torch functions that only allocate (their contents are whatever the kernels write).
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                         "new_empty_strided"})
#: Tensor methods that turn a tensor's contents into Python values (a replay would repeat
#: this recording's values).
READS_DATA = frozenset({"item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                        "__index__", "__array__", "__format__"})
#: In-place operators besides the ``name_`` methods.
WRITES = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
                    "__ixor__", "__ilshift__", "__irshift__", "__imatmul__"})

_state = threading.local()  # .calls: the list being recorded on this thread, if any


@dataclass(frozen=True)
class NativeCall:
    """One recorded call: ``function(*args)``, its nonzero status passed to ``check`` (which
    raises the kernel's typed error) when there is one."""

    function: Callable[..., int]
    args: tuple[Any, ...]
    check: Callable[[int], None] | None

    def __call__(self) -> None:
        status = self.function(*self.args)
        if status and self.check is not None:
            _failed(self.function, status, self.check)

    @property
    def name(self) -> str:
        return _name(self.function)


def native_call(function: Callable[..., int], *args: Any,
                check: Callable[[int], None] | None = None) -> None:
    """Call the C ``function(*args)`` (a ctypes function) and pass a nonzero status to
    ``check``, which raises (no ``check``: the return value is not a status). While
    :func:`record` records on this thread, the call is recorded instead, and made (and
    checked) when the graph is replayed."""
    calls = getattr(_state, "calls", None)
    if calls is not None:
        calls.append(NativeCall(function, args, check))
        return
    status = function(*args)
    if status and check is not None:
        _failed(function, status, check)


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__name__", repr(function))


def _failed(function: Callable[..., int], status: int, check: Callable[[int], None]) -> None:
    check(status)  # raises the kernel's error; a check that does not gets this one
    raise UnsupportedError(f"{_name(function)} returned {status}")


@dataclass
class StepGraph:
    """The native calls of one recorded step and the tensors it allocated (``outputs``
    among them: what the recorded step returned). :meth:`replay` reruns the calls."""

    calls: list[NativeCall] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)
    outputs: Any = None

    def replay(self) -> Any:
        """Rerun every call in order; returns :attr:`outputs`, now holding this run's
        results."""
        for call in self.calls:
            call()
        return self.outputs

    def canonical_calls(self) -> list[tuple[Any, ...]]:
        """The calls with each pointer into a tensor this graph allocated written as
        (allocation index, offset): what two recordings of one step share."""
        spans = sorted((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), i)
                       for i, t in enumerate(self.tensors))
        starts = [start for start, _, _ in spans]

        def canonical(arg: Any) -> Any:
            if isinstance(arg, int) and not isinstance(arg, bool) and spans:
                at = bisect.bisect_right(starts, arg) - 1
                if at >= 0 and arg < spans[at][0] + max(spans[at][1], 1):
                    return ("allocation", spans[at][2], arg - spans[at][0])
            return arg

        return [(call.name, *map(canonical, call.args)) for call in self.calls]


def same_calls(first: StepGraph, second: StepGraph) -> None:
    """Raise :class:`UnsupportedError` unless the two recordings made the same calls with
    the same arguments (allocations compared by position, see :meth:`StepGraph.
    canonical_calls`)."""
    a, b = first.canonical_calls(), second.canonical_calls()
    if len(a) != len(b):
        raise UnsupportedError(f"the step made {len(a)} native calls in one recording and "
                               f"{len(b)} in another: which kernels run depends on the data")
    for index, (one, other) in enumerate(zip(a, b, strict=True)):
        if one[0] != other[0]:
            raise UnsupportedError(f"native call {index} is {one[0]} in one recording and "
                                   f"{other[0]} in another: which kernels run depends on the "
                                   f"data")
        if one != other:
            differing = [i for i, (x, y) in enumerate(zip(one[1:], other[1:], strict=False))
                         if x != y]
            raise UnsupportedError(
                f"native call {index} ({one[0]}) changed between two recordings over "
                f"different inputs (argument(s) {differing}): its arguments depend on the "
                f"data, which a replay would not follow")


class OnlyAllocationsAndViews(TorchFunctionMode):
    """Refuses any torch function but an allocation, one that reads a tensor's metadata,
    or one that returns views of its inputs without writing them; keeps the
    allocations."""

    def __init__(self, keep: list[torch.Tensor]) -> None:
        super().__init__()
        self.keep = keep

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in READS_DATA or "out" in kwargs or (
                name.endswith("_") and not name.startswith("__")) or name in WRITES:
            raise UnsupportedError(f"the step calls torch's {name}: a step graph repeats only "
                                   f"native kernel calls")
        out = func(*args, **kwargs)
        outputs = _tensors(out)
        if name in ALLOCATIONS:
            self.keep.extend(outputs)
            return out
        if not outputs:  # a metadata read (a shape, a stride, a pointer): most calls
            return out
        storages = {_storage(t) for arg in (*args, *kwargs.values())
                    for t in _tensors(arg)} - {None}
        if any(_storage(t) not in storages for t in outputs):
            raise UnsupportedError(f"the step computes in torch ({name}): a step graph "
                                   f"repeats only native kernel calls")
        return out


#: Types whose values hold no tensor (what a metadata read returns).
_NO_TENSORS = (bool, int, float, str, type(None), torch.Size, torch.dtype, torch.device,
               torch.layout, torch.memory_format)


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The tensors in ``tree``: a tensor, a value of :data:`_NO_TENSORS` (at once: a step
    makes thousands of calls that read a tensor's metadata), or any pytree of them."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, _NO_TENSORS):
        return []
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _storage(tensor: torch.Tensor) -> int | None:
    """Where ``tensor``'s storage starts; None for a tensor without one (oneDNN's opaque
    packed weights, for one)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return None


@contextmanager
def record() -> Iterator[StepGraph]:
    """Record the native calls made on this thread into the yielded graph, without making
    them (the caller sets its ``outputs``, which hold results once it is replayed). Raises
    :class:`UnsupportedError` when the step computed in torch (raised from the op itself)
    or made no native call."""
    if getattr(_state, "calls", None) is not None:
        raise UnsupportedError("step graphs do not nest: this thread is already recording")
    graph = StepGraph()
    _state.calls = graph.calls
    try:
        with OnlyAllocationsAndViews(graph.tensors):
            yield graph
    finally:
        _state.calls = None
    if not graph.calls:
        raise UnsupportedError("the step made no native kernel call")
