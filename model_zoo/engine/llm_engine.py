"""``LLMEngine``: requests in, tokens and text out, one continuous-batching step at a time.

:meth:`LLMEngine.check_request` validates a tokenized prompt and its sampling parameters
against the model (vocabulary, context length, KV cache) without touching the engine's
state, so any thread may call it. :meth:`LLMEngine.add_request` queues a request as its
``n`` sequences; :meth:`LLMEngine.step` schedules one mixed batch, runs it, appends the
sampled tokens, detokenizes them, finishes sequences that reached a stop string, and
returns a :class:`RequestUpdate` per request it advanced: its newly streamable text and,
once every sequence of the request is done, its :class:`Output`.

The engine is not thread-safe: one thread drives it (see
:class:`~hwplug.model_zoo.engine.engine_loop.EngineLoop`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.engine.logprobs import RowLogprobs
from hwplug.model_zoo.engine.model_runner import ModelRunner
from hwplug.model_zoo.engine.output import CompletionOutput, Detokenizer, Logprob, Output
from hwplug.model_zoo.engine.scheduler import Scheduler
from hwplug.model_zoo.engine.sequence import ROOT_HASH, FinishReason, Sequence
from hwplug.model_zoo.engine.speculation import Speculator
from hwplug.model_zoo.engine.structured import Grammars
from hwplug.model_zoo.sampling import SamplingParams


@dataclass
class SampleDelta:
    """What one step added to completion ``index`` of a request: its newly streamable
    ``text`` (a stop string's possible start is held back until it is settled), the
    ``token_ids`` sampled, their log-probabilities when the request asked for them (one
    dict per token, as :attr:`CompletionOutput.logprobs`), and, once it is finished, its
    ``finish_reason`` and ``stop_reason``."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestUpdate:
    """What one step did for one request: ``delta``, its new streamable text (requests of
    one completion), ``samples``, what it added to each completion it advanced, and
    ``output`` once the request is finished."""

    request_id: str
    delta: str = ""
    output: Output | None = None
    #: The error that ended the request (its KV blocks failed to load), if one did.
    error: BaseException | None = None
    samples: list[SampleDelta] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load: sequences running and waiting, KV blocks in use
    of the cache's total, prompt tokens looked up in the prefix cache and found there,
    preemptions so far, steps run, and speculative decoding's counts."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    num_steps: int
    #: Speculative decoding: tokens proposed and verified, of them accepted, and
    #: verifications (one sequence's verify step each).
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verifications: int = 0
    #: Verify steps (each a step of the whole batch) served by a step graph's replay.
    replayed_verify_steps: int = 0
    #: Decode batch buckets (see :mod:`~hwplug.model_zoo.engine.decode_graphs`) recorded
    #: as step graphs, decode and verify steps served by a replay, and those that ran
    #: eagerly instead (0 each where steps never replay).
    step_graph_buckets: int = 0
    replayed_steps: int = 0
    eager_decode_steps: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted share of the proposed tokens (None: nothing proposed)."""
        return (self.spec_accepted_tokens / self.spec_proposed_tokens
                if self.spec_proposed_tokens else None)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens a verify step gives a sequence on average: its accepted proposals plus
        the target's own token (None: no verification)."""
        return (1 + self.spec_accepted_tokens / self.spec_verifications
                if self.spec_verifications else None)


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    seqs: list[Sequence] = field(default_factory=list)
    detokenizers: list[Detokenizer] = field(default_factory=list)


class LLMEngine:
    """A :class:`Scheduler` and a :class:`ModelRunner` sharing one KV cache, serving a
    model whose vocabulary holds ``vocab_size`` tokens."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer: Any,
                 vocab_size: int, root_hash: str = ROOT_HASH,
                 speculator: Speculator | None = None) -> None:
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        #: Speculative decoding's proposals and counts (None: off).
        self.speculator = speculator
        self.vocab_size = vocab_size
        #: The parent hash of every sequence's first KV block (names the model).
        self.root_hash = root_hash
        #: Steps run so far (each one batch over every request that could run).
        self.num_steps = 0
        self._requests: dict[str, _Request] = {}
        #: Compiles the structured-output constraints requests ask for.
        self.grammars = Grammars(tokenizer, vocab_size, scheduler.eos_token_ids)

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def check_request(self, prompt_ids: Seq[int], sampling: SamplingParams) -> None:
        """Raise a typed error unless the request can run: :class:`ModelError` for a prompt
        that is empty, holds ids outside the vocabulary, does not fit the model's context
        or could never fit the KV cache; :class:`ConfigError` for log-probability counts
        or stop token ids beyond the vocabulary, or an invalid structured-output constraint.
        Reads no mutable state."""
        if not prompt_ids:
            raise ModelError("the prompt is empty: it must hold at least one token")
        vocab = self.vocab_size
        bad = [t for t in prompt_ids
               if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ModelError(f"token ids must be integers in [0, {vocab}) (the model's "
                             f"vocabulary), got {bad[:5]!r}")
        if len(prompt_ids) >= self.max_model_len:
            raise ModelError(f"the prompt has {len(prompt_ids)} tokens but a sequence holds "
                             f"{self.max_model_len} (max_model_len), and at least one must be "
                             "left to generate")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(sampling, name)
            if k is not None and k > vocab:
                raise ConfigError(f"{name}={k} exceeds the vocabulary of {vocab} tokens")
        if any(t >= vocab for t in sampling.stop_token_ids):
            raise ConfigError(f"stop_token_ids must be below the vocabulary size {vocab}, got "
                              f"{list(sampling.stop_token_ids)}")
        if sampling.structured is not None:
            self.grammars.check(sampling.structured)
        blocks = self.scheduler.block_manager
        longest = min(len(prompt_ids) + sampling.max_tokens, self.max_model_len)
        if blocks.blocks_for(longest) > blocks.num_blocks:
            raise ModelError(f"a request of up to {longest} tokens needs "
                             f"{blocks.blocks_for(longest)} KV blocks but the cache has "
                             f"{blocks.num_blocks} of {blocks.block_size} tokens; lower "
                             "max_tokens or give the LLM more num_kv_blocks")

    def add_request(self, request_id: str, prompt_ids: Seq[int], sampling: SamplingParams,
                    prompt: str | None = None) -> list[Sequence]:
        """Queue a checked request (see :meth:`check_request`) as its ``sampling.n``
        sequences."""
        request = _Request(request_id, prompt, list(prompt_ids))
        for index in range(sampling.n):
            params = sampling.for_sample(index)
            generator = None
            if params.seed is not None:
                generator = torch.Generator(self.runner.device).manual_seed(params.seed)
            seq = Sequence(request.prompt_ids, params, generator, request_id=request_id,
                           index=index, root_hash=self.root_hash)
            if params.structured is not None:
                seq.guide = self.grammars.guide(params.structured)
            request.seqs.append(seq)
            request.detokenizers.append(Detokenizer(self.tokenizer, prompt_ids, params.stop))
        self._requests[request_id] = request
        for seq in request.seqs:
            self.scheduler.add(seq)
        return request.seqs

    def stats(self) -> EngineStats:
        """The engine's load now. Reads counters only, so any thread may call it while the
        engine's thread steps (the values may then be a step apart from each other)."""
        scheduler, blocks = self.scheduler, self.scheduler.block_manager
        spec, graphs = self.speculator, self.runner.graphs
        return EngineStats(
            num_running=len(scheduler.running), num_waiting=len(scheduler.waiting),
            kv_blocks_used=blocks.num_blocks - blocks.num_free_blocks,
            kv_blocks_total=blocks.num_blocks,
            prefix_queried_tokens=scheduler.num_prefix_queried_tokens,
            prefix_hit_tokens=scheduler.num_prefix_hit_tokens,
            num_preemptions=scheduler.num_preemptions, num_steps=self.num_steps,
            spec_proposed_tokens=spec.num_proposed if spec else 0,
            spec_accepted_tokens=spec.num_accepted if spec else 0,
            spec_verifications=spec.num_verified if spec else 0,
            replayed_verify_steps=graphs.verify_replays if graphs else 0,
            step_graph_buckets=graphs.num_recorded if graphs else 0,
            replayed_steps=graphs.replays if graphs else 0,
            eager_decode_steps=graphs.eager_steps if graphs else 0)

    def warm_up(self) -> list[int]:
        """Record the step graph of every decode batch bucket now (on the engine's thread,
        between steps), so the first steps at each batch size replay instead of running
        eagerly and recording; returns the buckets recorded ([]: steps never replay here).
        See :meth:`~hwplug.model_zoo.engine.decode_graphs.DecodeGraphs.record_all`."""
        graphs = self.runner.graphs
        if graphs is None:
            return []
        with torch.inference_mode():
            return graphs.record_all()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestUpdate]:
        """One step; an update for each request that got tokens."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.max_model_len)
        batch = self.scheduler.schedule()
        if not batch:
            raise ModelError("no waiting request fits the free KV cache and nothing is "
                             "running to free it")
        transfer = self.scheduler.kv_transfer
        # the step graphs' counters, read only to time the speculator's steps (below)
        graphs = self.runner.graphs if self.speculator is not None else None
        before = (graphs.replays, graphs.num_recorded) if graphs is not None else None
        started = time.perf_counter()
        if transfer is None:
            tokens, rewind = self.runner.step(batch), {}
        else:
            transfer.begin_step(batch)
            try:
                tokens = self.runner.step(batch, replay=not transfer.loading)
            except BaseException:
                transfer.end_step(completed=False)
                raise
            rewind = transfer.end_step()
        self.num_steps += 1
        if self.speculator is not None:
            # timed where it ran as its kind of step runs from then on: no graphs, or a replay
            # of a graph recorded before (not an eager step beside them, nor a recording)
            steady = before is None or (graphs.replays > before[0]
                                        and graphs.num_recorded == before[1])
            self.speculator.record(batch, tokens,
                                   time.perf_counter() - started if steady else None)
        advanced = self.scheduler.update(batch, tokens, rewind)
        errors = transfer.pop_errors() if transfer else {}
        updates = {request_id: RequestUpdate(request_id, error=error)
                   for request_id, error in errors.items()}
        for request_id in errors:
            self.abort(request_id)
        for seq, new in advanced:
            if seq.request_id in errors:
                continue
            request = self._requests[seq.request_id]
            detokenizer = request.detokenizers[seq.index]
            for count, token in enumerate(new, 1):
                if detokenizer.add_token(token) and not seq.is_finished:
                    del seq.token_ids[seq.num_tokens - (len(new) - count):]  # past the stop
                    new = new[:count]
                    seq.stop_reason = detokenizer.stop_reason
                    self.scheduler.finish(seq, FinishReason.STOP)
                    break
            if seq.guide is not None and not seq.is_finished and (
                    not seq.guide.accept(seq.token_ids[-1]) or seq.guide.done):
                self.scheduler.finish(seq, FinishReason.STOP)  # the structure is complete
            update = updates.setdefault(seq.request_id, RequestUpdate(seq.request_id))
            update.samples.append(self._sample_delta(seq, new,
                                                     detokenizer.stream(seq.is_finished)))
            if len(request.seqs) == 1:
                update.delta = update.samples[-1].text
        for update in updates.values():
            request = self._requests.get(update.request_id)
            if request is not None and all(seq.is_finished for seq in request.seqs):
                update.output = self._output(self._requests.pop(update.request_id))
                self._release(update.request_id)
        self.scheduler.block_manager.events.flush()
        return list(updates.values())

    def abort(self, request_id: str) -> None:
        """Drop a request (e.g. a stream closed early) and free its blocks; unknown or
        finished requests are ignored."""
        request = self._requests.pop(request_id, None)
        for seq in request.seqs if request else ():
            if not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.ABORT)
        if request is not None:
            self._release(request_id)

    def _release(self, request_id: str) -> None:
        if self.scheduler.kv_transfer is not None:
            self.scheduler.kv_transfer.request_finished(request_id)

    def abort_all(self) -> list[str]:
        """Drop every request; returns their ids."""
        ids = list(self._requests)
        for request_id in ids:
            self.abort(request_id)
        return ids

    def _output(self, request: _Request) -> Output:
        completions = []
        for seq, detokenizer in zip(request.seqs, request.detokenizers, strict=True):
            logprobs = None if seq.logprobs is None else [self._logprobs(row)
                                                          for row in seq.logprobs]
            cumulative = None if seq.logprobs is None else sum(
                row[token][0] for row, token in zip(seq.logprobs, seq.output_token_ids,
                                                    strict=True))
            completions.append(CompletionOutput(
                index=seq.index, text=detokenizer.text, token_ids=seq.output_token_ids,
                finish_reason=str(seq.finish_reason), cumulative_logprob=cumulative,
                logprobs=logprobs, stop_reason=seq.stop_reason))
        first = request.seqs[0].prompt_logprobs
        prompt_logprobs = None if first is None else [
            None if row is None else self._logprobs(row) for row in first]
        return Output(request_id=request.request_id, prompt_token_ids=request.prompt_ids,
                      outputs=completions, prompt=request.prompt,
                      prompt_logprobs=prompt_logprobs)

    def _sample_delta(self, seq: Sequence, tokens: list[int], text: str) -> SampleDelta:
        """What this step added to ``seq``: ``tokens`` (one, or a verify step's), the
        logprobs row of the one when it has one."""
        logprobs = None if seq.logprobs is None else [self._logprobs(seq.logprobs[-1])]
        finished = seq.is_finished
        return SampleDelta(seq.index, text, tokens, logprobs,
                           str(seq.finish_reason) if finished else None,
                           seq.stop_reason if finished else None)

    def _logprobs(self, row: RowLogprobs) -> dict[int, Logprob]:
        return {token: Logprob(value, rank, self.tokenizer.decode([token]))
                for token, (value, rank) in row.items()}
