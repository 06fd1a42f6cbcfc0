"""How many proposed tokens pay for their verify rows: :class:`ProposalLength`.

A verify step scores each proposal in a query row of its own, and rows cost time: little
where a decode step is bound by reading the weights (fp32 weights on a CPU, GPUs at small
batch), a good share of a step where it is bound by arithmetic (GGUF blocks on a 2-core
CPU: each row about a fifth of a one-row step). Proposing every sequence ``k`` tokens then
slows down text that the proposer guesses badly (open chat under prompt lookup).

The rule: sequence ``s``'s ``j``-th proposal is worth its row when the chance that it and
every proposal before it are accepted, ``p_s ** j``, is at least the row's cost over what
an accepted token saves, ``r = b * B / (a + b * B)`` for a step of ``B`` sequences timed as
``a + b * rows``. ``p_s`` is the sequence's recent acceptance per proposed token (accepted
over tried, decayed by :data:`DECAY` per verification, from a prior of 1 in 2), and ``a``
and ``b`` a least-squares fit of the engine's pure decode and verify steps (decayed by
:data:`STEP_DECAY` per step; where step graphs run, only replays of graphs recorded before
are timed: a recording step runs the model three times). Until the timed steps vary in
rows (no verify step timed yet) the cost is unknown and every sequence proposes one token,
the cheapest try (on SmolLM2 Q4_1, open chat: 0.97-1.05x of decoding without speculation
against 0.83-0.93x proposing the limit; benchmarks/speculative.py --until-eos, two runs
each). A sequence whose first proposal does not pay still proposes one token every
:data:`PROBE_EVERY` steps, so that its estimate can recover.
Greedy and sampled outputs do not depend on the length: verification is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Weight of a sequence's earlier verifications against its latest, per verification.
DECAY = 0.8
#: Weight of earlier step timings against the latest, per step.
STEP_DECAY = 0.98
#: A sequence whose first proposal does not pay proposes one token once in this many steps.
PROBE_EVERY = 16


@dataclass
class _Acceptance:
    """A sequence's decayed counts of accepted and tried proposals, and steps since the
    last probe."""

    accepted: float = 1.0
    tried: float = 2.0
    skipped: int = 0


class ProposalLength:
    """The per-sequence proposal lengths of the module docstring's rule."""

    def __init__(self) -> None:
        self._sequences: dict[int, _Acceptance] = {}
        #: Steps timed so far (observe_step).
        self.steps_timed = 0
        # decayed sums of the step fit: weight, rows, seconds, rows^2, rows*seconds
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def row_cost(self, batch: int) -> float:
        """``r`` for a step of ``batch`` sequences: a verify row's time over an accepted
        token's saving (0 while the fit has no spread of row counts)."""
        spread = self._w * self._xx - self._x * self._x
        if self._w == 0 or spread <= 1e-9 * self._w * self._xx:
            return 0.0
        per_row = (self._w * self._xy - self._x * self._y) / spread
        fixed = (self._y - per_row * self._x) / self._w
        if per_row <= 0:
            return 0.0
        return min(1.0, per_row * batch / max(fixed + per_row * batch, per_row * batch))

    def length(self, key: int, limit: int, batch: int) -> int:
        """How many of up to ``limit`` tokens sequence ``key`` proposes in a step of
        ``batch`` sequences (0: none this step)."""
        seq = self._sequences.setdefault(key, _Acceptance())
        cost, p = self.row_cost(batch), seq.accepted / seq.tried
        if cost <= 0:  # rows' cost not known yet: one token, the cheapest try
            return min(1, limit)
        worth = limit if p >= 1 else (
            0 if p <= 0 else min(limit, math.floor(math.log(cost) / math.log(p) + 1e-9)))
        if worth > 0:
            return worth
        seq.skipped += 1
        if seq.skipped >= PROBE_EVERY:
            seq.skipped = 0
            return min(1, limit)
        return 0

    def observe_verification(self, key: int, proposed: int, accepted: int) -> None:
        """Sequence ``key`` had ``accepted`` of its ``proposed`` tokens accepted."""
        seq = self._sequences.setdefault(key, _Acceptance())
        seq.accepted = DECAY * seq.accepted + accepted
        seq.tried = DECAY * seq.tried + accepted + (accepted < proposed)

    def observe_step(self, rows: int, seconds: float) -> None:
        """A pure decode (or verify) step of ``rows`` query rows took ``seconds``."""
        self.steps_timed += 1
        self._w = STEP_DECAY * self._w + 1
        self._x = STEP_DECAY * self._x + rows
        self._y = STEP_DECAY * self._y + seconds
        self._xx = STEP_DECAY * self._xx + rows * rows
        self._xy = STEP_DECAY * self._xy + rows * seconds

    def keep_only(self, keys: set[int]) -> None:
        """Drop the estimates of sequences other than ``keys`` (finished, or preempted:
        they start again from the prior)."""
        for key in self._sequences.keys() - keys:
            del self._sequences[key]
