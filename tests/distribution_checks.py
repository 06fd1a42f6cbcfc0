"""Pearson's chi-square test of sampled tokens against a known distribution, shared by the
tests of every sampler (the rejection sampler, a platform's device sampler)."""

from __future__ import annotations

import torch
from scipy.stats import chi2

#: The tests' significance level: a correct sampler fails one test in a thousand.
ALPHA = 1e-3


def chi_square(tokens: list[int] | torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of ``tokens`` against ``probs``; a token of probability 0 drawn
    is an infinite statistic."""
    counts = torch.bincount(torch.as_tensor(tokens), minlength=probs.numel()).double()
    support = probs > 0
    if bool((counts[~support] > 0).any()):
        return float("inf")
    expected = probs[support].double() * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum())


def threshold(probs: torch.Tensor) -> float:
    """The statistic's 1 - :data:`ALPHA` quantile over ``probs``' support."""
    return float(chi2.ppf(1 - ALPHA, int((probs > 0).sum()) - 1))
