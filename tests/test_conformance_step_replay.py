"""The kit's step-replay check: a platform's recorded decode steps must give the eager
steps' logits. The CPU platform's recorder (its C kernels' native calls) passes; a recorder
whose replay hands back what it recorded instead of recomputing fails, naming the step;
a platform without a recorder skips the check."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest

from hwplug.conformance import resolve_target
from hwplug.conformance.step_replay import STEPS, check_step_replay
from hwplug.platforms.cpu.platform import CpuPlatform


@dataclass
class _Kept:
    """A "recording" that keeps the outputs of the run it watched."""

    outputs: Any = None

    def replay(self) -> Any:
        return self.outputs  # the recorded run's logits, never recomputed


class _KeepsOutputs:
    """A broken recorder: the step runs once while "recorded", replays return its outputs."""

    name = "kept outputs"
    records_prefill = False
    warms_up = False

    @contextmanager
    def record(self) -> Iterator[_Kept]:
        yield _Kept()

    def check_same(self, first: _Kept, second: _Kept) -> None:
        pass


class _StaleCpu(CpuPlatform):
    def step_recorder(self) -> _KeepsOutputs:
        return _KeepsOutputs()


class _EagerCpu(CpuPlatform):
    def step_recorder(self) -> None:
        return None


@pytest.fixture(scope="module")
def cpu_target():
    return resolve_target("cpu")


def test_the_cpu_platforms_replayed_steps_pass(cpu_target):
    status, detail = check_step_replay(cpu_target)
    if status == "not checked":  # a CPU without the C kernels of every op refuses
        assert "refused the step" in detail
        return
    assert status == "passed", detail
    assert detail.startswith(f"native kernel calls on cpu: {STEPS - 1} of {STEPS} decode "
                             "steps of 2 sequences replayed")


def test_a_replay_that_repeats_recorded_outputs_fails(cpu_target):
    status, detail = check_step_replay(replace(cpu_target, platform=_StaleCpu()))
    assert status == "failed"
    assert detail.startswith("kept outputs: decode step 2 (replayed) gives logits")


def test_a_platform_without_a_recorder_skips_it(cpu_target):
    assert check_step_replay(replace(cpu_target, platform=_EagerCpu())) == (
        "skipped", "platform cpu replays no steps (step_recorder() is None)")
