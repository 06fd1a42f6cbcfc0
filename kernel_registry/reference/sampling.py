"""Reference of ``rejection_sample`` (speculative decoding's verification) and the
probability processing it shares with the engine's sampler (temperature, top-k, top-p).

The rule keeps the target distribution exact (Leviathan et al. 2023; Chen et al. 2023):
draft token ``x`` proposed with probability ``q(x)`` is accepted with probability
``min(1, p(x) / q(x))``; at the first rejection the token is drawn from the normalised
``max(0, p - q)``, and when every proposal is accepted a bonus token is drawn from the
target's distribution after the last one. A proposer that gives no ``q`` proposes
deterministically (``q`` is a point mass: an n-gram match, a greedy draft model), so ``x``
is accepted with probability ``p(x)`` and a rejection draws from ``p`` without ``x``.
A greedy row's ``p`` is the point mass on the target's argmax, which makes the same rule
"accept while the argmax matches, then the argmax".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def truncate(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``logits [N, V]`` with the tokens outside each row's top-k (``top_k [N]``, 0 = all)
    and top-p (``top_p [N]``: the smallest set whose probability reaches it) at ``-inf``."""
    vocab = logits.shape[-1]
    top_k = torch.where(top_k > 0, top_k, vocab)
    ordered, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    removed = rank[None, :] >= top_k[:, None]
    ordered = ordered.masked_fill(removed, float("-inf"))
    probs = ordered.softmax(dim=-1)
    # keep a token while the mass before it is below top_p (the first token always stays)
    removed |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]
    return logits.scatter(1, order, ordered.masked_fill(removed, float("-inf")))


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor) -> torch.Tensor:
    """The distribution each row of ``logits [N, V]`` samples from: ``softmax(logits /
    temperature)`` within its top-k / top-p set, or the point mass on its argmax where
    ``temperature`` is 0 (greedy). fp32."""
    logits = logits.float()
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, 1.0, temperature.float())[:, None]
    if bool(((top_k > 0) | (top_p < 1)).any()):
        scaled = truncate(scaled, top_k, top_p)
    probs = scaled.softmax(dim=-1)
    if bool(greedy.any()):
        point = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], point, probs)
    return probs


def _uniform(shape: tuple[int, ...], generators: Sequence[torch.Generator | None],
             device: torch.device, exponential: bool = False) -> torch.Tensor:
    """Noise ``[B, ...]``: row ``i`` from ``generators[i]`` where it has one, the rest
    from torch's default generator; uniform in [0, 1), or Exp(1) when ``exponential``."""
    noise = torch.empty(shape, device=device)
    if exponential:
        noise.exponential_()
    else:
        noise.uniform_()
    for i, generator in enumerate(generators):
        if generator is not None:
            if exponential:
                noise[i].exponential_(generator=generator)
            else:
                noise[i].uniform_(generator=generator)
    return noise


@torch.no_grad()
def rejection_sample(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                     num_draft_tokens: Sequence[int], draft_probs: torch.Tensor | None,
                     temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """See the op's contract in :mod:`hwplug.kernel_registry.ops_sampling`."""
    num_seqs = len(num_draft_tokens)
    device = target_logits.device
    if num_seqs == 0:
        return torch.empty((0, 1), dtype=torch.int64, device=device)
    width = max(num_draft_tokens) + 1
    counts = torch.tensor(num_draft_tokens, device=device)
    # the [B, width] index of each sequence's target rows (padding repeats its last row)
    starts = torch.cumsum(counts + 1, 0) - (counts + 1)
    cols = torch.arange(width, device=device)
    rows = starts[:, None] + torch.minimum(cols[None, :], counts[:, None])
    drafts = torch.zeros((num_seqs, width - 1), dtype=torch.int64, device=device)
    proposed = cols[None, :width - 1] < counts[:, None]  # [B, K]
    drafts[proposed] = draft_token_ids.long()
    if draft_probs is None and not bool((temperature > 0).any()):
        # greedy: accept while the argmax matches, then the argmax (no softmax needed)
        best = target_logits[rows.reshape(-1)].argmax(dim=-1).view(num_seqs, width)
        accept = (drafts == best[:, :-1]) & proposed
        num_accepted = accept.long().cumprod(dim=1).sum(dim=1)
        return _tokens(drafts, num_accepted, best.gather(1, num_accepted[:, None]).squeeze(1))

    params = [t.to(device)[:, None].expand(num_seqs, width).reshape(-1)
              for t in (temperature, top_k, top_p)]
    probs = target_probs(target_logits[rows.reshape(-1)], *params).view(num_seqs, width, -1)
    p_draft = probs[:, :-1].gather(2, drafts[..., None]).squeeze(2)  # p(x) [B, K]
    if draft_probs is None:  # a point mass on each proposal: q(x) = 1
        q_draft = torch.ones_like(p_draft)
    else:
        q = torch.zeros_like(probs[:, :-1])
        q[proposed] = draft_probs.float()
        q_draft = q.gather(2, drafts[..., None]).squeeze(2)
    accept = (_uniform((num_seqs, width - 1), generators, device) * q_draft < p_draft) & proposed
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # [B]

    # the next token: from the residual max(0, p - q) at the first rejection, else the bonus
    at = num_accepted[:, None, None].expand(-1, 1, probs.shape[-1])
    final = probs.gather(1, at).squeeze(1)
    rejected = num_accepted < counts
    if draft_probs is None:  # max(0, p - point mass at x): p without x
        # (the column past the proposals is never a rejected one: any id, and there even
        # when no sequence proposed anything)
        rejected_token = torch.cat((drafts, drafts.new_zeros((num_seqs, 1))), dim=1)
        rejected_token = rejected_token.gather(1, num_accepted[:, None])
        residual = final.scatter(1, rejected_token, 0.0)
    else:
        q_at = torch.cat((q, torch.zeros_like(probs[:, :1])), dim=1).gather(1, at).squeeze(1)
        residual = (final - q_at).clamp_(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    use_residual = (rejected[:, None] & (mass > 0))
    final = torch.where(use_residual, residual / mass.clamp(min=1e-30), final)
    noise = _uniform(tuple(final.shape), generators, device, exponential=True)
    return _tokens(drafts, num_accepted, (final / noise).argmax(dim=-1))  # exponential race


def _tokens(drafts: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor
            ) -> torch.Tensor:
    """``[B, K + 1]``: each row's accepted proposals, then ``last``, then -1."""
    num_seqs, width = drafts.shape[0], drafts.shape[1] + 1
    cols = torch.arange(width - 1, device=drafts.device)
    out = torch.full((num_seqs, width), -1, dtype=torch.int64, device=drafts.device)
    out[:, :-1] = torch.where(cols[None, :] < num_accepted[:, None], drafts, -1)
    out.scatter_(1, num_accepted[:, None], last[:, None])
    return out
