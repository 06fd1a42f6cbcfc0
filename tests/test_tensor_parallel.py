"""Tensor parallelism in real gloo process groups: every rank's logits equal one process's.

Tiny random Llama and Qwen3 models with 2 ranks (heads split evenly), and a Llama with 6
query and 3 KV heads over 3 ranks (one KV head each); the model files are the ones every
platform runs. fp32 logits agree to :data:`ATOL` (the all-reduce sums partial products in
another order) and greedy tokens are identical.
"""

from __future__ import annotations

import pytest
import torch
from dist_workers import run, tensor_parallel_logits
from tiny_models import greedy_logits

from hwplug.errors import ConfigError
from hwplug.model_zoo.parallel import TensorParallel

pytestmark = pytest.mark.slow  # each test starts worker processes

ATOL = 1e-4
STEPS = 4


@pytest.mark.parametrize("name, world_size", [("llama", 2), ("llama-tied-bias", 2),
                                              ("qwen3", 2), ("llama-3kv", 3)])
def test_tensor_parallel_logits_equal_one_process(name, world_size):
    want = greedy_logits(name, STEPS)
    for rank, got in enumerate(run(tensor_parallel_logits, world_size, name, STEPS)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=1e-4, msg=f"rank {rank}")
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_heads_that_do_not_split_are_a_typed_error():
    with pytest.raises(ConfigError, match=r"attention heads \(4\) does not split evenly over "
                                          "3 tensor-parallel ranks"):
        greedy_logits("llama", 1, TensorParallel(3, 0))
    with pytest.raises(ConfigError, match="2 KV heads neither split over nor divide 3"):
        TensorParallel(3, 0).kv_heads(6, 2)
