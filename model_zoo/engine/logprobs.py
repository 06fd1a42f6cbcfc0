"""Log-probabilities a request asked for (``SamplingParams.logprobs`` / ``prompt_logprobs``).

:func:`top_logprobs` turns rows of raw logits into, per row, the log-probability and rank
of a target token (the sampled one, or the next prompt token) and of the ``k`` most
likely tokens. Ranks count from 1 (the most likely token) and ties share the better rank,
as vLLM reports them. The runner calls it with the model's logits before sampling touches
them, so the numbers are those of the model's own distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.sequence import Sequence as EngineSequence

#: token id -> (log-probability, rank); one per row.
RowLogprobs = dict[int, tuple[float, int]]

#: Rows of logits turned into log-probabilities at once (bounds the ``[rows, vocab]``
#: float32 temporaries of a long prompt's ``prompt_logprobs``).
ROWS_PER_CHUNK = 256


def top_logprobs(logits: torch.Tensor, targets: Sequence[int], ks: Sequence[int]
                 ) -> list[RowLogprobs]:
    """For each row of ``logits [N, vocab]``: ``targets[i]`` then the ``ks[i]`` most likely
    tokens, each mapped to ``(log-probability, rank)``."""
    if not len(targets):
        return []
    logprobs = logits.float().log_softmax(dim=-1)
    target = torch.tensor(list(targets), device=logits.device)[:, None]
    chosen = logprobs.gather(1, target)
    ranks = ((logprobs > chosen).sum(dim=-1) + 1).tolist()
    chosen_values = chosen[:, 0].tolist()
    most = max(ks)
    top_values, top_ids = (logprobs.topk(most, dim=-1) if most
                           else (logprobs[:, :0], logprobs[:, :0].long()))
    return logprob_rows(targets, chosen_values, ranks, top_values.tolist(), top_ids.tolist(),
                        ks)


def logprob_rows(targets: Sequence[int], chosen: Sequence[float], ranks: Sequence[int],
                 top_values: Sequence[Sequence[float]], top_ids: Sequence[Sequence[int]],
                 ks: Sequence[int]) -> list[RowLogprobs]:
    """The rows :func:`top_logprobs` returns, from its numbers computed elsewhere (e.g. on a
    device): per row the target's log-probability and rank, and the log-probabilities
    and ids of at least ``ks[i]`` most likely tokens, best first."""
    rows = []
    for i, token in enumerate(targets):
        row = {int(token): (chosen[i], ranks[i])}
        for rank in range(ks[i]):
            row.setdefault(int(top_ids[i][rank]), (top_values[i][rank], rank + 1))
        rows.append(row)
    return rows


def record_prompt_logprobs(seqs: Sequence[EngineSequence], num_new_tokens: Sequence[int],
                           hidden: torch.Tensor,
                           compute_logits: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Append to each sequence's ``prompt_logprobs`` the entries this step's hidden states
    ``[T, hidden]`` give: position ``p`` of a prompt predicts prompt token ``p + 1``.

    ``seqs[i]`` computed its next ``num_new_tokens[i]`` tokens this step (its
    ``num_computed_tokens`` not yet advanced). Entries already recorded (before a
    preemption) are not recorded again. Logits are computed :data:`ROWS_PER_CHUNK` rows
    at a time.
    """
    rows: list[int] = []
    targets: list[int] = []
    ks: list[int] = []
    owners: list[EngineSequence] = []
    offset = 0
    for seq, num_new in zip(seqs, num_new_tokens, strict=True):
        if seq.prompt_logprobs is not None:
            first = seq.num_computed_tokens
            k = seq.sampling.prompt_logprobs
            for position in range(max(first, len(seq.prompt_logprobs) - 1),
                                  min(first + num_new, seq.num_prompt_tokens - 1)):
                rows.append(offset + position - first)
                targets.append(seq.token_ids[position + 1])
                ks.append(k)
                owners.append(seq)
        offset += num_new
    for start in range(0, len(rows), ROWS_PER_CHUNK):
        end = start + ROWS_PER_CHUNK
        logits = compute_logits(hidden[rows[start:end]])
        for seq, row in zip(owners[start:end], top_logprobs(logits, targets[start:end],
                                                             ks[start:end]), strict=True):
            seq.prompt_logprobs.append(row)
