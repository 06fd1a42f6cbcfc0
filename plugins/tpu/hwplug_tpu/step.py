"""A model step compiled whole: the JAX ops of a recorded step composed into one jitted
function (the tpu platform's :class:`~hwplug.step_replay.StepRecorder`).

While :meth:`JaxStepRecorder.record` records, each of this plugin's kernel variants
computes nothing: it hands its JAX function and arguments to the thread's
:class:`Recording` (:func:`recording`) and returns torch placeholders of the result's shape
(allocated, never written). A torch tensor an op receives is, in the recording, one of

- a **weight** the engine placed on the device (:func:`hwplug_tpu.bridge.place`): an argument
  of the compiled step, passed as the resident array;
- a **KV cache** placed there: state, passed in and returned (its buffers donated), the
  cache writes of the step updating it in order;
- a **placeholder** an earlier op returned, or a view of one (the view is recomputed from
  its offset, shape and strides);
- anything else: an **input** of the step, read from the same torch tensor at every replay
  (as with CUDA graphs, the caller refills static input tensors).

As with the CPU's step graphs, the model may only allocate and take views in torch while
recording (:class:`~hwplug.platforms.cpu.step_graph.OnlyAllocationsAndViews`), and here
also change a tensor's dtype (``.float()``, ``.to(dtype)``, ...: recorded as a JAX cast,
e.g. the LM head's float32 logits of a bfloat16 model), pick rows by an integer
tensor (``hidden[sample_rows]``, a prefill step's sampled rows), copy a strided view
(``.contiguous()``, DeepSeek's roped query slice) and add two tensors of one dtype
(``a + b``, DeepSeek's shared and routed experts), each recorded as its JAX
counterpart: an op that falls back to a torch
reference refuses the recording, naming it. A replay transfers the
inputs to the device, runs the compiled step (one XLA program per recorded step, compiled
at its first replay) and copies its outputs back into the placeholders the recorded step
returned: those are the only transfers of a step. A sampled replay
(:meth:`CompiledStep.replay_sampled`, a decode step's) runs the step and the sampler in one
program (another compilation of the same recording): then the step's inputs and the
sampling's per-row arrays go in, and only the token ids come back (and the
log-probabilities a request asked for).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils._pytree import tree_leaves

from hwplug.errors import UnsupportedError
from hwplug.step_replay import SampledTokens, SampleRequest
from hwplug_tpu.bridge import (
    device,
    is_cache,
    placed_base,
    replace_cache,
    resident,
    send,
    strided_view,
    to_torch,
    view_of,
)
from hwplug_tpu.sampler import logprobs_width, request_arrays, sample, sampled_tokens
from hwplug_tpu.step_torch import AllocationsViewsAndCasts

logger = logging.getLogger(__name__)
_state = threading.local()  # .recording: the Recording of this thread, if any

#: A reference to a value of the compiled step: ``("param" | "input" | "state" | "value",
#: index)`` or ``("view", base, offset, shape, stride)``.
Ref = tuple


def recording() -> Recording | None:
    """The step being recorded on this thread, or None (ops then compute)."""
    return getattr(_state, "recording", None)


@dataclass(frozen=True)
class Node:
    """One recorded op: ``fn(*args, **static)``; its result replaces KV cache ``state``
    when that is set, else its leaves are appended to the step's values."""

    fn: Callable[..., Any]
    args: tuple[Ref | None, ...]
    static: tuple[tuple[str, Any], ...]
    state: int | None

    def signature(self) -> tuple[Any, ...]:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return (getattr(self.fn, "__module__", ""), name, self.args, self.static, self.state)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _aval(tensor: torch.Tensor | None) -> jax.ShapeDtypeStruct | None:
    if tensor is None:
        return None
    dtype = jnp.int32 if tensor.dtype == torch.int64 else jnp.dtype(
        str(tensor.dtype).removeprefix("torch."))
    return jax.ShapeDtypeStruct(tuple(tensor.shape), dtype)


class Recording:
    """The ops of a step being recorded and what they read (see the module docstring)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.params: list[torch.Tensor] = []
        self.states: list[torch.Tensor] = []
        self.inputs: list[torch.Tensor] = []
        #: Placeholders and every tensor given a reference, kept alive (their ids stay
        #: theirs), and the allocations the model made.
        self.tensors: list[torch.Tensor] = []
        self._refs: dict[int, Ref] = {}
        self._bases: dict[int, tuple[torch.Tensor, Ref]] = {}
        self._values = 0

    def ref(self, tensor: torch.Tensor | None) -> Ref | None:
        """The reference of ``tensor`` in the compiled step (made on first sight)."""
        if tensor is None:
            return None
        found = self._refs.get(id(tensor))
        if found is not None:
            return found
        base = self._bases.get(_storage(tensor))
        if is_cache(tensor):
            ref: Ref = ("state", len(self.states))
            self.states.append(tensor)
        elif resident(tensor) is not None:
            ref = ("param", len(self.params))
            self.params.append(tensor)
        elif (weight := placed_base(tensor)) is not None:  # a view of a placed weight
            ref = ("view", self.ref(weight), *view_of(tensor, weight))
        elif base is not None:
            ref = ("view", base[1], tensor.storage_offset(), tuple(tensor.shape),
                   tuple(tensor.stride()))
        else:
            ref = ("input", len(self.inputs))
            self.inputs.append(tensor)
            if tensor.storage_offset() == 0 and tensor.is_contiguous() and (
                    tensor.numel() * tensor.element_size()
                    == tensor.untyped_storage().nbytes()):
                self._bases[_storage(tensor)] = (tensor, ref)
        self._refs[id(tensor)] = ref
        self.tensors.append(tensor)
        return ref

    def call(self, fn: Callable[..., Any], *tensors: torch.Tensor | None, **static: Any) -> Any:
        """Record ``fn(*tensors, **static)`` (JAX arrays in, a pytree of arrays out); returns
        torch placeholders shaped like its result."""
        args = tuple(self.ref(t) for t in tensors)
        shapes = jax.eval_shape(functools.partial(fn, **static), *map(_aval, tensors))
        leaves, structure = jax.tree.flatten(shapes)
        self.nodes.append(Node(fn, args, tuple(sorted(static.items())), None))
        placeholders = []
        for leaf in leaves:
            tensor = torch.empty(leaf.shape, dtype=getattr(torch, jnp.dtype(leaf.dtype).name))
            ref = ("value", self._values)
            self._values += 1
            self._refs[id(tensor)] = ref
            self._bases[_storage(tensor)] = (tensor, ref)
            self.tensors.append(tensor)
            placeholders.append(tensor)
        return jax.tree.unflatten(structure, placeholders)

    def update(self, cache: torch.Tensor, fn: Callable[..., jax.Array],
               *tensors: torch.Tensor, **static: Any) -> None:
        """Record ``cache = fn(cache, *tensors, **static)`` on a placed KV cache."""
        ref = self.ref(cache)
        if ref[0] != "state":
            raise UnsupportedError("a step writes a KV cache the engine did not place on the "
                                   "JAX device")
        self.nodes.append(Node(fn, tuple(self.ref(t) for t in tensors),
                               tuple(sorted(static.items())), ref[1]))

    def output(self, tensor: torch.Tensor) -> Ref:
        """The reference of an output of the step: a value an op computed, or a view of one."""
        ref = self._refs.get(id(tensor)) or self.ref(tensor)
        if ref[0] not in ("value", "view"):
            raise UnsupportedError(f"the step returns a tensor no JAX op computed ({ref[0]})")
        return ref

    def program(self, outputs: list[Ref]) -> Callable[..., Any]:
        """The step as a function ``(params, states, inputs) -> (outputs, states)``."""
        nodes = list(self.nodes)

        def program(params: list, states: list, inputs: list) -> tuple[list, list]:
            states, values = list(states), []
            sources = {"param": params, "state": states, "input": inputs, "value": values}

            def value(ref: Ref | None) -> jax.Array | None:
                if ref is None:
                    return None
                if ref[0] == "view":
                    return strided_view(value(ref[1]), *ref[2:])
                return sources[ref[0]][ref[1]]

            for node in nodes:
                args = [value(ref) for ref in node.args]
                if node.state is None:
                    values.extend(jax.tree.leaves(node.fn(*args, **dict(node.static))))
                else:
                    states[node.state] = node.fn(states[node.state], *args,
                                                 **dict(node.static))
            return [value(ref) for ref in outputs], states

        return program

    def signature(self) -> tuple[Any, ...]:
        """What two recordings of one step over different input contents share."""
        return ([node.signature() for node in self.nodes], [id(t) for t in self.params],
                [id(t) for t in self.states], [_aval(t) for t in self.inputs])


class CompiledStep:
    """A recorded step (:class:`~hwplug.step_replay.SamplingStep`): :meth:`replay` runs it
    as one compiled XLA program, :meth:`replay_sampled` as one that also samples its
    logits (:mod:`hwplug_tpu.sampler`)."""

    def __init__(self, recording: Recording, recorder: JaxStepRecorder) -> None:
        self.recording, self.recorder = recording, recorder
        self.outputs: Any = None
        #: The compiled programs: None -> the step; ``("sample", k)`` -> the step ending in
        #: sampling with ``k`` top log-probabilities (None: none).
        self._compiled: dict[Any, Any] = {}
        self._outputs: list[torch.Tensor] = []

    def replay(self) -> Any:
        """Transfer the inputs, run the compiled step over the resident weights and KV
        caches, copy the outputs back; returns :attr:`outputs`, now holding them."""
        self._outputs = [t for t in tree_leaves(self.outputs) if isinstance(t, torch.Tensor)]
        outputs = self._run(None, [])
        with jax.transfer_guard("allow"):  # the step's declared outputs
            for tensor, out in zip(self._outputs, outputs, strict=True):
                tensor.copy_(to_torch(out))
        return self.outputs

    def replay_sampled(self, request: SampleRequest) -> SampledTokens:
        """Replay the step and sample the first ``len(request.seeds)`` rows of its logits
        (its one output, ``[rows, vocab]``) in the same program; only the tokens (and the
        log-probabilities asked for) come back."""
        (logits,) = self._outputs = [t for t in tree_leaves(self.outputs)
                                     if isinstance(t, torch.Tensor)]
        extra = request_arrays(request, logits.shape[0])
        outputs = self._run(("sample", logprobs_width(request)), extra)
        with jax.transfer_guard("allow"):  # the step's declared outputs
            return sampled_tokens([to_torch(out) for out in outputs], request)

    def _run(self, kind: Any, extra: list[np.ndarray]) -> list[jax.Array]:
        """Run program ``kind`` (compiled at its first run) over the transferred inputs and
        ``extra`` ones; the KV caches are replaced by its new ones; returns its outputs."""
        rec = self.recording
        target = device()
        with jax.transfer_guard("allow"):  # the step's declared inputs
            inputs = [send(t, target) for t in rec.inputs] + [send(a, target) for a in extra]
        params = [resident(t) for t in rec.params]
        states = [resident(t) for t in rec.states]
        compiled = self._compiled.get(kind)
        if compiled is None:
            compiled = self._compiled[kind] = self._compile(kind, params, states, inputs)
        outputs, states = compiled(params, states, inputs)
        for cache, new in zip(rec.states, states, strict=True):
            replace_cache(cache, new)
        return outputs

    def _compile(self, kind: Any, params: list, states: list, inputs: list) -> Any:
        step = self.recording.program([self.recording.output(t) for t in self._outputs])
        program = step
        if kind is not None:
            count = len(self.recording.inputs)

            def program(params: list, states: list, inputs: list) -> tuple[list, list]:
                (logits,), states = step(params, states, inputs[:count])
                return list(sample(logits, *inputs[count:], logprobs=kind[1])), states

        compiled = jax.jit(program, donate_argnums=1).lower(params, states, inputs).compile()
        shapes = tuple(tuple(t.shape) for t in self.recording.inputs)
        self.recorder.compiled.append(shapes)
        logger.info("compiled a step of %d JAX ops over %d resident weights and %d KV caches%s; "
                    "its inputs %s", len(self.recording.nodes), len(params), len(states),
                    "" if kind is None else f", sampling its logits ({kind[1]} top logprobs)",
                    shapes)
        return compiled


class JaxStepRecorder:
    """Steps recorded as the JAX ops of this plugin's variants and compiled whole (see the
    module docstring). :attr:`compiled` lists each compiled step by its inputs' shapes."""

    name = "one compiled JAX function per step"
    #: Prefill steps are recorded too (:mod:`hwplug.model_zoo.engine.prefill_graphs`).
    records_prefill = True
    warms_up = False

    def __init__(self) -> None:
        self.compiled: list[tuple[tuple[int, ...], ...]] = []

    @contextmanager
    def record(self) -> Iterator[CompiledStep]:
        if recording() is not None:
            raise UnsupportedError("step recordings do not nest: this thread is already "
                                   "recording")
        rec = Recording()
        _state.recording = rec
        try:
            with AllocationsViewsAndCasts(rec):
                yield CompiledStep(rec, self)
        finally:
            _state.recording = None
        if not rec.nodes:
            raise UnsupportedError("the step ran no JAX op")

    def check_same(self, first: CompiledStep, second: CompiledStep) -> None:
        one, other = first.recording.signature(), second.recording.signature()
        if one != other:
            raise UnsupportedError("the step's JAX ops changed between two recordings over "
                                   "different inputs: what it computes depends on the data")

    def describe(self) -> str:
        """``"decode steps: 2 compiled (one per batch bucket)"``."""
        return f"steps compiled whole: {len(self.compiled)}"


#: The tpu platform's recorder.
RECORDER = JaxStepRecorder()
