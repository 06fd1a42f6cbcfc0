"""hwplug-cuda's CUDA graphs: decode steps captured once per batch bucket and replayed give
the eager steps' logits and greedy tokens, over contexts that grow past the recording's.

Needs an NVIDIA GPU (CI has none: skipped there); ``benchmarks/device_check.sh`` runs it on
a lent one. The model is a tiny random Llama on the cuda platform's kernels (Triton
attention); three sequences decode from position 0, so their steps pad to bucket 4.
"""

from __future__ import annotations

import pytest
import torch
from model_harness import InMemoryCheckpoint
from tiny_models import random_state

import hwplug
from hwplug.conformance.step_replay import decode_logits
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.engine.model_runner import GraphLimits, ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")

#: Max |logit difference| over the logits' range, replayed vs eager: the replay's decode
#: attention splits the context as for ``max_model_len`` keys, the eager step as for its
#: own, so their sums round differently (in the model dtype between layers).
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2}
BLOCK_SIZE = 16


def test_the_cuda_platform_captures_cuda_graphs():
    platform = hwplug.current_platform()
    assert platform.name == "cuda"
    assert platform.step_recorder().name == "CUDA graphs"
    assert platform.describe()["step_replay"] == "CUDA graphs"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_decode_steps_give_the_eager_steps_logits(dtype):
    config, state = random_state("llama")
    model, ctx = build_model(InMemoryCheckpoint(config, state), dtype=dtype,
                             block_size=BLOCK_SIZE)
    assert ctx.device.type == "cuda"
    graphed = ModelRunner(model, ctx, 8, step_graphs=GraphLimits(4, 64))
    eager = ModelRunner(model, ctx, 8)
    assert eager.graphs is None
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, config.vocab_size, (3,), generator=generator).tolist()
    tables = [[0, 3], [1, 4], [2, 5]]
    replays = []
    for position in range(20):  # past the first block: contexts the recording never had
        positions = [position] * 3
        slots = [table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE
                 for table in tables]
        got, replayed = decode_logits(graphed, tokens, positions, slots, tables)
        want, _ = decode_logits(eager, tokens, positions, slots, tables)
        replays.append(replayed)
        error = float((got - want).abs().max() / (want.max() - want.min()))
        assert error < TOLERANCE[dtype], (position, error)
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()
    graphs = graphed.graphs
    assert graphs.refused == {}
    assert (graphs.recorded, graphs.replays) == ([4], 19)
    assert replays == [False] + [True] * 19  # the bucket is recorded at its second step
