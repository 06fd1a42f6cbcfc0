"""``NgramProposer``: prompt lookup. The last tokens of a sequence (prompt and output so
far) are looked up earlier in it, and the tokens that followed the latest of the longest
matches (at most ``prompt_lookup_max`` tokens) are proposed when that match is at least
``prompt_lookup_min`` tokens long, or, shorter (down to one token), when every earlier
occurrence of it was followed by the same token (``prompt_lookup_unambiguous``): after the
output leaves a copied stretch, a word that occurs once in the prompt resumes the copy at
once instead of ``prompt_lookup_min`` tokens later. No model runs, so it costs next to
nothing when nothing matches, and copies well (code edits, quotes, repeated structure)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

from hwplug import checks
from hwplug.errors import ConfigError
from hwplug.model_zoo.speculative.proposer import Proposal, Proposer

if TYPE_CHECKING:
    from hwplug.model_zoo.engine.sequence import Sequence


def lookup(tokens: Seq[int], min_n: int, max_n: int, k: int,
           unambiguous: bool = False) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of ``tokens``' longest
    recurring suffix (at most ``max_n`` tokens long) when that suffix has at least ``min_n``
    tokens, or (``unambiguous``) fewer when all its earlier occurrences were followed by the
    same token; else none."""
    size = len(tokens)
    if size < 2:
        return []
    last = tokens[-1]
    # every earlier occurrence of the last token (latest first), the suffix it ends grown
    # backwards: the longest length, and the ends of the occurrences that long
    longest, ends = 0, []
    for end in range(size - 2, -1, -1):
        if tokens[end] != last:
            continue
        n = 1
        while n < max_n and n <= end and tokens[end - n] == tokens[size - 1 - n]:
            n += 1
        if n > longest:
            longest, ends = n, [end]
        elif n == longest:
            ends.append(end)
    if longest >= min_n or (unambiguous and longest
                            and len({tokens[end + 1] for end in ends}) == 1):
        return list(tokens[ends[0] + 1:ends[0] + 1 + k])
    return []


class NgramProposer(Proposer):
    """Prompt lookup (see the module docstring); deterministic proposals."""

    #: Defaults: a match of 3 tokens or more proposes, shorter ones when unambiguous, and
    #: matches count up to 16 tokens. On SmolLM2 (benchmarks/speculative.py, 96 tokens,
    #: k = 4, two runs on a Zen 4) a shortest match of 2 proposed more often and was
    #: accepted less (open chat: 7% against 12%); over decoding without speculation, 2 gave
    #: 0.92-0.97x on open chat and 1.06-1.28x on the copying prompts, 3 gave 1.02-1.05x and
    #: 1.13-1.47x. The unambiguous shorter matches and the longer ones: docs/benchmarks.md.
    options = {"prompt_lookup_min": (3, checks.integer(1, 64)),
               "prompt_lookup_max": (16, checks.integer(1, 64)),
               "prompt_lookup_unambiguous": (True, checks.boolean)}

    @classmethod
    def check_options(cls, name: str, given: Mapping[str, Any]) -> dict[str, Any]:
        options = super().check_options(name, given)
        if options["prompt_lookup_min"] > options["prompt_lookup_max"]:
            raise ConfigError(f"{name}: prompt_lookup_min ({options['prompt_lookup_min']}) "
                              f"must be <= prompt_lookup_max ({options['prompt_lookup_max']})")
        return options

    def propose(self, seqs: Seq[Sequence], limits: Seq[int]) -> Proposal:
        options = self.config.options
        return Proposal([lookup(seq.token_ids, options["prompt_lookup_min"],
                                options["prompt_lookup_max"], limit,
                                options["prompt_lookup_unambiguous"])
                         for seq, limit in zip(seqs, limits, strict=True)])
