"""The tpu platform's step recorder on a small step of JAX variants: views (contiguous,
rows of a split, transposed), dtype casts, placed weights, static inputs refilled between
replays; what it refuses.
"""

from __future__ import annotations

import jax
import pytest
import torch

from hwplug.errors import UnsupportedError
from hwplug_tpu import variants
from hwplug_tpu.bridge import device, place
from hwplug_tpu.step import JaxStepRecorder


@pytest.fixture
def weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(32, 16, generator=generator).bfloat16(),
               "norm": torch.rand(16, generator=generator).bfloat16() + 0.5}
    for tensor in tensors.values():
        place(tensor, device())
    return tensors


def step(x: torch.Tensor, weights: dict[str, torch.Tensor], eps: float = 1e-6
         ) -> tuple[torch.Tensor, torch.Tensor]:
    y = variants.linear(x, weights["w"])  # [4, 32] bfloat16
    normed = variants.rms_norm(y[:, 8:24], weights["norm"], eps)  # rows of a split
    gated = variants.silu_and_mul(y.t())  # a transposed view: [32, 2]
    return normed.float(), gated.view(-1).float()


def test_a_recorded_step_replays_over_refilled_inputs(weights):
    recorder = JaxStepRecorder()
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    with recorder.record() as graph:
        graph.outputs = step(x, weights)
    for seed in (1, 2):
        x.copy_(torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)))
        with jax.transfer_guard("disallow_explicit"):
            got = [t.clone() for t in graph.replay()]
        want = step(x, weights)  # op by op
        assert all(t.dtype == torch.float32 for t in got)
        for one, other in zip(got, want, strict=True):
            torch.testing.assert_close(one, other, atol=2e-2, rtol=2e-2)
            assert one.abs().sum() > 0
    assert len(recorder.compiled) == 1


def test_two_recordings_of_one_step_are_the_same_and_a_changed_one_is_not(weights):
    recorder = JaxStepRecorder()
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    recordings = []
    for eps in (1e-6, 1e-6, 1e-5):
        with recorder.record() as graph:
            graph.outputs = step(x, weights, eps)
        recordings.append(graph)
    recorder.check_same(recordings[0], recordings[1])
    with pytest.raises(UnsupportedError, match="changed between two recordings"):
        recorder.check_same(recordings[0], recordings[2])


def test_a_step_that_computes_in_torch_is_refused(weights):
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedError, match=r"computes in torch \(add\)"), \
            JaxStepRecorder().record() as graph:
        graph.outputs = variants.linear(x, weights["w"]) + 1


def test_contiguous_copies_sums_and_views_of_placed_weights_are_recorded(weights):
    """DeepSeek's step: ``.contiguous()`` of a strided slice, the sum of two op outputs,
    and an op reading a view of a placed weight (``W_UK`` of ``kv_b_proj``), which stays a
    resident weight of the step rather than an input sent at every replay."""
    x = torch.zeros(4, 16, dtype=torch.bfloat16)

    def deepseek_like() -> torch.Tensor:
        y = variants.linear(x, weights["w"])  # [4, 32]
        half = variants.linear(x, weights["w"][8:24])  # a view of a placed weight: [4, 16]
        return y[:, 16:].contiguous() + half

    with JaxStepRecorder().record() as graph:
        graph.outputs = deepseek_like()
    assert [tuple(t.shape) for t in graph.recording.inputs] == [(4, 16)]  # x only
    x.copy_(torch.randn(4, 16, generator=torch.Generator().manual_seed(3)))
    with jax.transfer_guard("disallow_explicit"):
        got = graph.replay().clone()
    torch.testing.assert_close(got, deepseek_like(), atol=2e-2, rtol=2e-2)
    assert got.abs().sum() > 0
