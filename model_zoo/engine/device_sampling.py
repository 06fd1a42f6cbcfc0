"""Sampling a step's tokens on the platform's device (:meth:`hwplug.Platform.device_sampler`).

Where the platform has a device sampler, the runner hands it every step whose sampled
rows it serves: greedy, temperature, top-k, top-p, seeds and log-probabilities. A decode
step replayed from a step graph then samples inside its recorded step
(:class:`~hwplug.step_replay.SamplingStep`: the logits never leave the device, only the
tokens and the log-probabilities asked for come back); an eager step hands its logits to
the sampler. A row that needs what the device sampler does not do (a repetition,
frequency or presence penalty, structured output's token mask, speculative verification)
makes its whole step sample on the host in torch (:func:`hwplug.model_zoo.sampling.sample`);
each such step is logged at debug level and counted by reason (:attr:`DeviceSampling.host_steps`).

A row's random draw derives from a seed and the position of the token it samples
(:class:`~hwplug.step_replay.SampleRequest`): the request's seed (``seed + i`` for its
``i``-th completion), or for an unseeded request one drawn from the engine's generator at
that step. So a seeded request samples the same tokens whatever else its steps hold,
whether they were replayed or eager.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence as Seq

import torch

from hwplug.model_zoo.engine.logprobs import logprob_rows
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.step_replay import DeviceSampler, SampledTokens, SampleRequest

logger = logging.getLogger(__name__)


def host_only(seq: Sequence) -> str | None:
    """Why ``seq``'s next token must be sampled on the host, or None."""
    params = seq.sampling
    if seq.spec_token_ids:
        return "speculative verification"
    if seq.guide is not None:
        return "structured output"
    if params.repetition_penalty != 1:
        return "repetition penalty"
    if params.frequency_penalty or params.presence_penalty:
        return "frequency/presence penalty"
    return None


class DeviceSampling:
    """The runner's use of a platform's :class:`~hwplug.step_replay.DeviceSampler`;
    ``generator`` (the engine's) seeds the rows of unseeded requests."""

    def __init__(self, sampler: DeviceSampler, generator: torch.Generator | None) -> None:
        self.sampler, self.generator = sampler, generator
        #: Steps sampled on the device.
        self.device_steps = 0
        #: Steps sampled on the host, by the reason (:func:`host_only`) of their first row
        #: that needed it.
        self.host_steps: Counter[str] = Counter()

    def serves(self, seqs: Seq[Sequence]) -> bool:
        """Whether the device samples the next tokens of ``seqs``; when not, the step is
        logged and counted as sampled on the host."""
        for seq in seqs:
            reason = host_only(seq)
            if reason is not None:
                self.host_steps[reason] += 1
                logger.debug("a step of %d sequences samples on the host: %s", len(seqs),
                             reason)
                return False
        return True

    def request(self, seqs: Seq[Sequence]) -> SampleRequest:
        """The sampling of ``seqs``' next tokens (see the module docstring)."""
        params = [seq.sampling for seq in seqs]
        drawn = torch.randint(0, torch.iinfo(torch.int64).max, (len(seqs),),
                              generator=self.generator).tolist()
        asked = [p.logprobs for p in params if p.logprobs is not None]
        return SampleRequest(
            temperature=[p.temperature for p in params], top_k=[p.top_k for p in params],
            top_p=[p.top_p for p in params],
            seeds=[d if p.seed is None else p.seed for p, d in zip(params, drawn, strict=True)],
            positions=[len(seq.token_ids) for seq in seqs],
            logprobs=max(asked) if asked else None)

    def accept(self, sampled: SampledTokens, seqs: Seq[Sequence]) -> list[int]:
        """``sampled``'s tokens; the log-probabilities of the sequences that asked for them
        appended to their ``logprobs``."""
        self.device_steps += 1
        if sampled.logprobs is not None:
            chosen, ranks, top_values, top_ids = sampled.logprobs
            wanted = [i for i, seq in enumerate(seqs) if seq.logprobs is not None]
            rows = logprob_rows([sampled.tokens[i] for i in wanted],
                                [chosen[i] for i in wanted], [ranks[i] for i in wanted],
                                [top_values[i] for i in wanted], [top_ids[i] for i in wanted],
                                [seqs[i].sampling.logprobs for i in wanted])
            for i, row in zip(wanted, rows, strict=True):
                seqs[i].logprobs.append(row)
        return sampled.tokens

    def describe(self) -> str:
        """``"sampled on the device: 12 steps; on the host: 3 (repetition penalty: 3)"``."""
        host = sum(self.host_steps.values())
        reasons = ", ".join(f"{why}: {n}" for why, n in sorted(self.host_steps.items()))
        return (f"sampled on the device: {self.device_steps} steps; on the host: {host}"
                + (f" ({reasons})" if reasons else ""))
