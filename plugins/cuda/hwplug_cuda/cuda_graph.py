"""Decode steps captured as CUDA graphs: hwplug-cuda's :class:`~hwplug.step_replay.StepRecorder`.

A recording captures every kernel the step launches, on a side stream, into a
``torch.cuda.CUDAGraph`` with its own memory pool; a replay launches them again on the
current stream, over the same input, intermediate and output memory (the step's static
inputs, which the engine refills, and the outputs the recorded step returned). The engine
runs the step once eagerly right before each recording (``warms_up``): Triton compiles and
loads its kernels and cuBLAS picks its algorithms outside the capture, where they may.

What a replay could get wrong, and why it does not: CUDA's stream capture refuses any copy
of device memory into Python (the step's recording then fails, and its steps run eagerly),
so a captured step cannot branch on its tensors' contents. Its only host-side inputs are
the metadata's maxima (``max_seq_len``, ``max_query_len``), and the engine keeps the
recording made over the longest context, whose kernels serve every shorter one: the decode
attention's split-KV grid covers ``max_model_len`` keys and each program reads its
sequence's length from device memory, skipping splits past it. Two recordings of a step may
therefore launch different kernels (one split or several), and :meth:`check_same` asks only
that both returned the same outputs' shapes and dtypes. The capture's mode is
``thread_local``: other threads (a server's) may use the GPU meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from hwplug.errors import UnsupportedError


@dataclass
class CudaGraphStep:
    """One captured step (a :class:`~hwplug.step_replay.RecordedStep`)."""

    graph: torch.cuda.CUDAGraph = field(default_factory=torch.cuda.CUDAGraph)
    outputs: Any = None

    def replay(self) -> Any:
        """Launch the captured kernels again; :attr:`outputs` then hold this run's results."""
        self.graph.replay()
        return self.outputs


class CudaGraphRecorder:
    """Steps captured as CUDA graphs (see the module docstring)."""

    name = "CUDA graphs"
    records_prefill = False
    warms_up = True

    @contextmanager
    def record(self) -> Iterator[CudaGraphStep]:
        """Capture the kernels the block launches into the yielded step; raises
        :class:`~hwplug.errors.UnsupportedError` when the step's outputs are not all on the
        GPU (what computed them elsewhere would not run again)."""
        step = CudaGraphStep()
        with torch.cuda.graph(step.graph, capture_error_mode="thread_local"):
            yield step
        elsewhere = {str(leaf.device) for leaf in tree_leaves(step.outputs)
                     if isinstance(leaf, torch.Tensor) and leaf.device.type != "cuda"}
        if elsewhere or step.outputs is None:
            raise UnsupportedError(f"the step's outputs are on {', '.join(sorted(elsewhere))}, "
                                   "not the GPU" if elsewhere else "the step returned nothing")

    def check_same(self, first: CudaGraphStep, second: CudaGraphStep) -> None:
        """Raise unless both recordings returned outputs of the same shapes and dtypes; the
        kernels they launch may differ (see the module docstring)."""
        if _signature(first.outputs) != _signature(second.outputs):
            raise UnsupportedError("the step's outputs changed between two recordings over "
                                   f"different inputs: {_signature(first.outputs)} vs "
                                   f"{_signature(second.outputs)}")


def _signature(outputs: Any) -> list[tuple[tuple[int, ...], torch.dtype]]:
    return [(tuple(leaf.shape), leaf.dtype) for leaf in tree_leaves(outputs)
            if isinstance(leaf, torch.Tensor)]


#: The cuda platform's recorder.
RECORDER = CudaGraphRecorder()
