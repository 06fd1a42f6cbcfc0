"""Replaying a recorded model step: a capability a platform may have.

A platform that can run a step again without re-running its Python (the CPU platform
records the native kernel calls a decode step makes; hwplug-cuda captures a CUDA graph)
returns a :class:`StepRecorder` from :meth:`hwplug.Platform.step_recorder`. The
engine then records each decode batch size once and replays it; on a platform that
returns None (the default) every step runs eagerly and nothing is ever recorded.

A platform may also sample on its device (:meth:`hwplug.Platform.device_sampler`): then
the logits stay there and only the sampled tokens (and the log-probabilities a request
asked for) come back. Its :class:`DeviceSampler` samples the logits of an eager step, and
its recorded steps are :class:`SamplingStep` s, which end a replay in the same sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


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
    #: Whether the engine records prefill steps too (per tokens and sequences bucket), not
    #: only decode steps.
    records_prefill: bool
    #: Whether the engine runs a step once, eagerly and over the same inputs, right before
    #: recording it (a CUDA graph's capture must not compile or load kernels). A recorder
    #: without this attribute is read as False.
    warms_up: bool

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


@dataclass(frozen=True)
class SampleRequest:
    """How to sample each of a step's rows on the device: ``temperature`` (0 = greedy),
    ``top_k`` (0 = all tokens) and ``top_p`` as :class:`~hwplug.SamplingParams` say, and
    the ``seeds`` and ``positions`` (of the tokens being sampled) the random draws derive
    from: a row's draw is a function of its seed, its position and its logits only, so a
    seeded request samples the same tokens whatever else its steps hold. ``logprobs``:
    the most top log-probabilities a row asks for (None: no row asks for any; then only
    the tokens come back)."""

    temperature: Sequence[float]
    top_k: Sequence[int]
    top_p: Sequence[float]
    seeds: Sequence[int]
    positions: Sequence[int]
    logprobs: int | None = None


@dataclass(frozen=True)
class SampledTokens:
    """The tokens a device sampled, one per row, and when the request asked for
    log-probabilities (of the raw logits, before temperature and truncation), per row:
    the sampled token's log-probability and rank (1 = most likely; ties share the better
    rank) and the request's ``logprobs`` most likely tokens' log-probabilities and ids."""

    tokens: list[int]
    logprobs: tuple[list[float], list[int], list[list[float]], list[list[int]]] | None = None


class DeviceSampler(Protocol):
    """A platform's sampling on its device (see the module docstring)."""

    def sample(self, logits: torch.Tensor, request: SampleRequest) -> SampledTokens:
        """Sample each row of ``logits [n, vocab]`` (an eager step's, in torch)."""
        ...


class SamplingStep(RecordedStep, Protocol):
    """A recorded step whose :attr:`outputs` are logits ``[rows, vocab]`` and whose replay
    can end in sampling them on the device."""

    def replay_sampled(self, request: SampleRequest) -> SampledTokens:
        """Replay the step and sample its first ``len(request.seeds)`` rows of logits;
        only the tokens (and the log-probabilities asked for) come back."""
        ...
