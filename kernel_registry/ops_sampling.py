"""The op of speculative decoding's verification: ``rejection_sample``.

Its reference (:mod:`hwplug.kernel_registry.reference.sampling`) is exact: the tokens it
returns follow the target's distribution whatever the proposals were. Its output is token
ids, so a variant must return the same ids as the reference for greedy rows, and for
sampled rows tokens of the same distribution (the tolerance below is for the ids of
greedy rows; the reference's own statistical test is ``tests/test_rejection_sample.py``).
"""

from __future__ import annotations

from hwplug.kernel_registry.registry import kernels

__all__ = ["rejection_sample"]

rejection_sample = kernels.define_op(
    "rejection_sample", "hwplug.kernel_registry.reference.sampling:rejection_sample",
    tolerances={"float32": (0.0, 0.0)}, doc="""
rejection_sample(target_logits [T, V] float32, draft_token_ids [T - B] int64,
                 num_draft_tokens: list[int] (B), draft_probs [T - B, V] | None,
                 temperature [B] float32, top_k [B] int64, top_p [B] float32,
                 generators: list[torch.Generator | None] (B)) -> [B, max_k + 1] int64
    Verifies B sequences' proposals. Sequence i proposed k_i = num_draft_tokens[i] tokens
    (the next k_i of draft_token_ids; k_i may be 0) and owns the next k_i + 1 rows of
    target_logits: row r scores the token after its r-th proposal (row 0: after its last
    accepted token). Each row's distribution p is softmax(logits / temperature) within its
    top_k (0 = all) / top_p set, the point mass on the argmax where temperature is 0.
    Proposal x (draft probability q(x): its draft_probs row, or 1 when draft_probs is None,
    a deterministic proposer) is accepted with probability min(1, p(x) / q(x)), in order,
    until the first rejection, whose token is drawn from normalised max(0, p - q) (from p
    when that is empty); when all k_i are accepted a bonus token is drawn from row k_i.
    Row i of the result holds the accepted proposals, then that one token, then -1: 1 to
    k_i + 1 tokens. Greedy rows draw nothing at random; the others draw from generators[i]
    (a seeded request's), or torch's default generator where it is None.
""")
