"""The conformance kit on ``rejection_sample`` (issue 31): its input generator's cases have
outcomes that do not depend on random draws, so a correct variant passes whatever it
draws, and deliberately broken ones, registered here, fail: one that accepts past a
mismatch, one that scores each proposal against the next row, one that drops the bonus
token after fully accepted proposals."""

from __future__ import annotations

import pytest
import torch

from hwplug import current_platform, kernels
from hwplug.conformance import check_variant
from hwplug.kernel_registry.reference import sampling
from hwplug.registry import current_source


@pytest.fixture
def private_variants(fresh_discovery):
    """Register variants under a private source; drop them afterwards."""
    current_platform()
    token = current_source.set("test_conformance_sampling")
    yield kernels
    current_source.reset(token)
    kernels.drop_source("test_conformance_sampling")


def _other_draws(logits, drafts, counts, *args):
    """The reference after drawing from torch's default generator: other random numbers."""
    torch.rand(17)
    return sampling.rejection_sample(logits, drafts, counts, *args)


def _accepts_everything(logits, drafts, counts, *args):
    out = sampling.rejection_sample(logits, drafts, counts, *args)
    start = 0
    for i, count in enumerate(counts):  # every proposal, then the argmax after the last
        out[i, :count] = drafts[start - i:start - i + count]
        out[i, count] = logits[start + count].argmax()
        start += count + 1
    return out


def _scores_the_next_row(logits, drafts, counts, *args):
    return sampling.rejection_sample(logits.roll(-1, dims=0), drafts, counts, *args)


def _drops_the_bonus(logits, drafts, counts, *args):
    out = sampling.rejection_sample(logits, drafts, counts, *args)
    for i, count in enumerate(counts):
        if int((out[i] >= 0).sum()) == count + 1:  # every proposal accepted: no bonus
            out[i, count] = -1
    return out


BROKEN = {"accepts_everything": _accepts_everything,
          "scores_the_next_row": _scores_the_next_row, "drops_the_bonus": _drops_the_bonus}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_rejection_sample_variant_fails(name, private_variants):
    private_variants.register_variant("rejection_sample", name, BROKEN[name],
                                      dtypes=("float32",))
    result = check_variant(f"rejection_sample/{name}", examples=30)
    assert result.status == "failed" and "max abs error" in result.detail, result


def test_a_variant_drawing_other_random_numbers_passes(private_variants):
    private_variants.register_variant("rejection_sample", "other_draws", _other_draws,
                                      dtypes=("float32",))
    result = check_variant("rejection_sample/other_draws", examples=30)
    assert result.status == "passed" and "30 inputs matched" in result.detail, result
