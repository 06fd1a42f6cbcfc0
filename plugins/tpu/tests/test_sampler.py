"""Sampling on the JAX device (issue 28, TPU item 1): greedy rows are the host's argmax,
sampled rows follow the reference's distribution, a row's draw depends on its seed and
position only, log-probabilities are the host's.

Chi-square threshold as in ``tests/test_rejection_sample.py``: the 0.999 quantile of chi2
with (support size - 1) degrees of freedom, over 20,000 draws (rows of one seed at
positions 0..19,999); the seeds are fixed, so the tests are deterministic, and each also
checks that an untruncated distribution of another temperature fails it (the test has power).
"""

from __future__ import annotations

import pytest
import torch
from distribution_checks import chi_square, threshold

from hwplug.kernel_registry.reference.sampling import target_probs
from hwplug.model_zoo.engine.logprobs import top_logprobs
from hwplug.model_zoo.sampling import SamplingParams, SamplingRow, sample
from hwplug.step_replay import SampleRequest
from hwplug_tpu.sampler import SAMPLER

DRAWS = 20_000
LOGITS = torch.tensor([1.2, 0.3, -0.5, 2.0, 0.0, 0.8])


def request(n: int, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
            seeds: list[int] | None = None, positions: list[int] | None = None,
            logprobs: int | None = None) -> SampleRequest:
    return SampleRequest([temperature] * n, [top_k] * n, [top_p] * n,
                         seeds if seeds is not None else [7] * n,
                         positions if positions is not None else list(range(n)), logprobs)


def test_greedy_rows_take_the_hosts_argmax():
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    got = SAMPLER.sample(logits, request(5)).tokens
    host = sample(logits.clone(), [SamplingRow(SamplingParams())] * 5).tolist()
    assert got == host == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize(("temperature", "top_k", "top_p"),
                         [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0), (1.3, 0, 0.7),
                          (0.8, 4, 0.9)])
def test_sampled_rows_follow_the_reference_distribution(temperature, top_k, top_p):
    logits = LOGITS.expand(DRAWS, -1).contiguous()
    tokens = SAMPLER.sample(logits, request(DRAWS, temperature=temperature, top_k=top_k,
                                            top_p=top_p)).tokens
    one = torch.ones(1)
    want = target_probs(LOGITS[None], temperature * one, torch.tensor([top_k]),
                        top_p * one)[0]
    assert chi_square(tokens, want) < threshold(want)
    # a sampler with another temperature and no truncation would fail
    wrong = (LOGITS / (1.5 * temperature)).softmax(dim=-1)
    assert chi_square(tokens, wrong) > threshold(wrong)


def test_a_rows_draw_depends_on_its_seed_and_position_only():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    seeds, positions = [3, 2**64 - 1, 5, 3, 9, 11, 0, 2**40], [10, 4, 7, 11, 2, 9, 5, 1]
    first = SAMPLER.sample(logits, request(8, temperature=1.0, seeds=seeds,
                                           positions=positions)).tokens
    # the same rows in another order, beside other rows, in a batch of another bucket
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    others = torch.randn(9, 50, generator=torch.Generator().manual_seed(2))
    shuffled = torch.cat((logits[order], others))
    again = SAMPLER.sample(shuffled, request(
        17, temperature=1.0, seeds=[seeds[i] for i in order] + [1] * 9,
        positions=[positions[i] for i in order] + list(range(9)))).tokens
    assert [again[order.index(i)] for i in range(8)] == first
    # another seed or position draws other tokens (over a flat distribution: 1 in 50 each)
    flat = torch.zeros(64, 50)
    base = SAMPLER.sample(flat, request(64, temperature=1.0)).tokens
    other_seed = SAMPLER.sample(flat, request(64, temperature=1.0, seeds=[8] * 64)).tokens
    shifted = SAMPLER.sample(flat, request(64, temperature=1.0,
                                           positions=list(range(1, 65)))).tokens
    assert sum(a == b for a, b in zip(base, other_seed, strict=True)) < 10
    assert sum(a == b for a, b in zip(base, shifted, strict=True)) < 10
    assert shifted[:-1] == base[1:]  # equal logits, seed and position: the same draw


def test_greedy_rows_beside_sampled_ones_stay_greedy():
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3))
    mixed = SampleRequest([0.0, 1.0, 0.0, 2.0, 0.0, 1.0], [0, 5, 0, 0, 0, 0],
                          [1.0, 1.0, 1.0, 0.5, 1.0, 1.0], [1] * 6, list(range(6)))
    tokens = SAMPLER.sample(logits, mixed).tokens
    best = logits.argmax(dim=-1).tolist()
    assert [tokens[i] for i in (0, 2, 4)] == [best[i] for i in (0, 2, 4)]
    assert tokens[1] in logits[1].topk(5).indices.tolist()


def test_log_probabilities_are_the_hosts():
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(4))
    sampled = SAMPLER.sample(logits, request(3, temperature=1.0, logprobs=3))
    chosen, ranks, top_values, top_ids = sampled.logprobs
    want = top_logprobs(logits, sampled.tokens, [3, 3, 3])
    for i, row in enumerate(want):
        assert ranks[i] == row[sampled.tokens[i]][1]
        assert chosen[i] == pytest.approx(row[sampled.tokens[i]][0], abs=1e-5)
        assert len(top_ids[i]) == 3
        for value, token in zip(top_values[i], top_ids[i], strict=True):
            assert value == pytest.approx(row[token][0], abs=1e-5)
    assert SAMPLER.sample(logits, request(3)).logprobs is None
