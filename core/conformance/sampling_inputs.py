"""Input generator of ``rejection_sample`` (speculative decoding's verification; see
:mod:`hwplug.conformance.inputs` for the generator contract).

The op's result is token ids, which a variant must match exactly where the outcome does
not depend on random draws (its contract). So every drawn row's target distribution is a
point mass on the row's argmax: greedy rows (temperature 0), and sampled rows whose top-k
is 1 or whose top-p keeps only the most likely token (temperature drawn, so the sampled
path runs: scaling, truncation, the acceptance test, the residual and bonus draws). A
proposal is then accepted exactly when it is its row's argmax, with or without draft
probabilities, and the token after the last accepted one is that row's argmax; a variant
that accepts past a mismatch, scores a proposal against the wrong row, misses a
sequence's bonus token or ignores top-k / top-p differs from the reference. Batches mix
sequences of 0 to 6 proposals; proposals are their row's argmax two times in three (so
runs of acceptances occur), else a random token; logits are spread (scale 4) so that no
two tokens of a row tie. What these cases cannot see is the sampled rule's statistics (a
variant that always decides greedily passes them): that is a chi-square test's job, as
``tests/test_rejection_sample.py`` does for the reference.
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from hwplug.conformance.case import Case, randn, seeded

#: Each sequence's sampling, all deterministic outcomes: (label, temperature, top_k, top_p).
MODES = (("greedy", 0.0, 0, 1.0), ("greedy top-k 5", 0.0, 5, 1.0),
         ("top-k 1", None, 1, 1.0), ("top-p 1e-6", None, 0, 1e-6))


@st.composite
def rejection_sample(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """``dtype`` (float32) target logits of ``tokens`` rows, split into sequences."""
    rng = seeded(draw)
    num_rows, vocab = draw(tokens), draw(st.sampled_from((8, 50, 1000)))
    counts, left = [], num_rows
    while left:  # sequences of k proposals, k + 1 rows each
        counts.append(draw(st.integers(0, min(6, left - 1))))
        left -= counts[-1] + 1
    logits = randn(rng, (num_rows, vocab), dtype, scale=4.0)
    best = logits.argmax(dim=-1)
    drafts, row = [], 0
    for count in counts:
        for j in range(count):
            hit = torch.rand((), generator=rng) < 2 / 3
            drafts.append(int(best[row + j]) if hit else
                          int(torch.randint(0, vocab, (), generator=rng)))
        row += count + 1
    modes = [draw(st.sampled_from(MODES)) for _ in counts]
    temperature = torch.tensor([t if t is not None else draw(st.sampled_from((0.5, 1.0, 2.0)))
                                for _, t, _, _ in modes], dtype=torch.float32)
    with_probs = draw(st.booleans())
    draft_probs = (torch.rand((len(drafts), vocab), generator=rng) + 0.01).softmax(dim=-1) \
        if with_probs else None
    args = (logits, torch.tensor(drafts, dtype=torch.int64), counts, draft_probs, temperature,
            torch.tensor([k for _, _, k, _ in modes], dtype=torch.int64),
            torch.tensor([p for _, _, _, p in modes], dtype=torch.float32),
            [None] * len(counts))
    label = (f"{num_rows} rows of {vocab} logits, proposals per sequence {counts}, "
             f"{'with' if with_probs else 'without'} draft probabilities, "
             f"{[mode[0] for mode in modes]}")
    return Case(args, {}, (dtype,), label)
