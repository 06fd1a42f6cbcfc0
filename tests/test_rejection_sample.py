"""The ``rejection_sample`` op (issue 31, item 2): greedy verification against a plain
loop, and the stochastic rule against the target's distribution by chi-square tests.

Chi-square threshold: the 0.999 quantile of chi2 with (support size - 1) degrees of
freedom (18.47 for 4 degrees), over 20,000 draws; the seeds are fixed, so the tests are
deterministic, and each also shows that the proposal's own distribution fails it (the
test has power).
"""

from __future__ import annotations

import pytest
import torch
from distribution_checks import chi_square, threshold

from hwplug.kernel_registry.ops_sampling import rejection_sample
from hwplug.kernel_registry.reference.sampling import target_probs

DRAWS = 20_000


def verify(logits_rows, drafts, counts, *, draft_probs=None, temperature=0.0, top_k=0,
           top_p=1.0, generators=None):
    b = len(counts)
    return rejection_sample(
        logits_rows, torch.tensor(drafts, dtype=torch.int64), counts, draft_probs,
        torch.full((b,), float(temperature)), torch.full((b,), top_k, dtype=torch.int64),
        torch.full((b,), float(top_p)), generators or [None] * b)


def greedy_loop(rows: torch.Tensor, drafts: list[int]) -> list[int]:
    """Accept while the argmax matches, then the argmax (all accepted: the bonus)."""
    out = []
    for r, draft in enumerate(drafts):
        best = int(rows[r].argmax())
        if best != draft:
            return [*out, best]
        out.append(draft)
    return [*out, int(rows[len(drafts)].argmax())]


def test_greedy_accepts_while_the_argmax_matches():
    gen = torch.Generator().manual_seed(0)
    counts = [3, 0, 5, 2, 4]
    logits = torch.randn(sum(counts) + len(counts), 50, generator=gen)
    drafts, want, start = [], [], 0
    for i, k in enumerate(counts):
        rows = logits[start:start + k + 1]
        argmaxes = rows.argmax(dim=-1).tolist()
        # sequence i's proposals match the target for its first i tokens, then differ
        mine = [a if r < i else (a + 1) % 50 for r, a in enumerate(argmaxes[:k])]
        drafts += mine
        want.append(greedy_loop(rows, mine))
        start += k + 1
    got = verify(logits, drafts, counts)
    assert got.shape == (5, 6)
    for row, expected in zip(got.tolist(), want, strict=True):
        assert row[:len(expected)] == expected and set(row[len(expected):]) <= {-1}
    assert [len(w) for w in want] == [1, 1, 3, 3, 5]  # mismatch, none proposed, ..., bonus


LOGITS = torch.tensor([[1.2, 0.3, -0.5, 2.0, 0.0], [0.1, 1.5, -1.0, 0.4, 0.9],
                       [0.0, 0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (1.0, 0.8), (0.7, 0.9)],
                         ids=["temperature 1", "top-p 0.8", "temperature 0.7 top-p 0.9"])
def test_a_draft_models_proposals_leave_the_target_distribution_exact(temperature, top_p):
    torch.manual_seed(1)
    p = target_probs(LOGITS[:1], torch.tensor([temperature]), torch.tensor([0]),
                     torch.tensor([top_p]))[0]
    q = torch.tensor([0.05, 0.5, 0.3, 0.05, 0.1])  # a poor draft: mass where p has little
    drafts = torch.multinomial(q, DRAWS, replacement=True)
    logits = LOGITS[:2].repeat(DRAWS, 1)  # each sequence: one proposal, two target rows
    out = verify(logits, drafts.tolist(), [1] * DRAWS, draft_probs=q.repeat(DRAWS, 1),
                 temperature=temperature, top_p=top_p)
    assert chi_square(out[:, 0], p) < threshold(p)
    assert chi_square(drafts, p) > threshold(p)  # the proposals alone would fail
    accepted = out[:, 1] >= 0
    assert bool((out[accepted, 0] == drafts[accepted]).all())


@pytest.mark.parametrize("top_p", [1.0, 0.8], ids=["temperature 1", "top-p 0.8"])
def test_deterministic_proposals_keep_every_position_exact(top_p):
    """An n-gram proposal (no draft probabilities) of two tokens: the first output token
    follows row 0's distribution; given the first proposal was accepted, the second
    follows row 1's."""
    torch.manual_seed(2)
    probs = target_probs(LOGITS, torch.ones(3), torch.zeros(3, dtype=torch.int64),
                         torch.full((3,), top_p))
    drafts = [0, 4]  # token 0: p ~ 0.2 in row 0; token 4 in row 1
    out = verify(LOGITS.repeat(DRAWS, 1), drafts * DRAWS, [2] * DRAWS, temperature=1.0,
                 top_p=top_p)
    assert chi_square(out[:, 0], probs[0]) < threshold(probs[0])
    first_accepted = out[:, 0] == drafts[0]
    assert chi_square(out[first_accepted, 1], probs[1]) < threshold(probs[1])
    point = torch.nn.functional.one_hot(torch.tensor(drafts[0]), 5).float()
    assert chi_square(out[:, 0], (probs[0] + point) / 2) > threshold(probs[0])


def test_top_k_keeps_rejections_inside_the_k_most_likely():
    torch.manual_seed(3)
    out = verify(LOGITS[:2].repeat(2000, 1), [2] * 2000, [1] * 2000, temperature=1.0,
                 top_k=2)
    assert set(out[:, 0].tolist()) == {0, 3}  # the two most likely of row 0; 2 never kept


def test_a_seeded_row_draws_the_same_tokens_whatever_its_neighbours():
    def run(neighbours: int) -> list[int]:
        generators = [torch.Generator().manual_seed(7)] + [None] * neighbours
        counts = [2] * (neighbours + 1)
        out = verify(LOGITS.repeat(neighbours + 1, 1), [1, 1] * (neighbours + 1), counts,
                     temperature=1.0, generators=generators)
        return out[0].tolist()

    torch.manual_seed(4)
    alone = run(0)
    torch.manual_seed(5)
    assert run(6) == alone


def test_an_empty_batch_and_the_reference_is_what_the_op_serves():
    assert verify(torch.empty(0, 5), [], []).shape == (0, 1)
    from hwplug.kernel_registry import kernels

    assert kernels.op("rejection_sample").tolerances == {"float32": (0.0, 0.0)}


def test_greedy_rows_beside_sampled_ones_and_with_draft_probabilities_stay_greedy():
    """The general path (a sampled row in the batch, or draft probabilities given) gives a
    greedy row's point mass the same "accept while the argmax matches" result."""
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(9, 30, generator=gen)  # three sequences of two proposals each
    best = logits.argmax(dim=-1).tolist()
    drafts = [best[0], best[1], best[3], (best[4] + 1) % 30, 5, 6]
    want = [greedy_loop(logits[0:3], drafts[0:2]), greedy_loop(logits[3:6], drafts[2:4])]
    mixed = rejection_sample(logits, torch.tensor(drafts), [2, 2, 2], None,
                             torch.tensor([0.0, 0.0, 1.0]), torch.zeros(3, dtype=torch.int64),
                             torch.ones(3), [None] * 3)
    q = torch.softmax(torch.randn(6, 30, generator=gen), dim=-1)
    with_q = rejection_sample(logits, torch.tensor(drafts), [2, 2, 2], q, torch.zeros(3),
                              torch.zeros(3, dtype=torch.int64), torch.ones(3), [None] * 3)
    for out in (mixed, with_q):
        assert out[0].tolist() == want[0] and out[1].tolist()[:2] == want[1]


def test_sampled_sequences_without_proposals_draw_one_token_each():
    """k_i = 0 for every sequence (the contract allows it): one token each, from its row
    (top-k 1: that row's argmax), with and without draft probabilities."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(5)) * 4
    for draft_probs in (None, torch.empty(0, 50)):
        out = verify(logits, [], [0, 0, 0], draft_probs=draft_probs, temperature=1.0,
                     top_k=1)
        assert out.tolist() == [[t] for t in logits.argmax(dim=-1).tolist()]
