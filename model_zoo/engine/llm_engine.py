"""``LLMEngine``: requests in, tokens and text out, one continuous-batching step at a time.

:meth:`LLMEngine.add_request` validates a tokenized prompt against the model's context
length and the KV cache and queues it; :meth:`LLMEngine.step` schedules one mixed batch,
runs it, appends the sampled tokens, detokenizes them, finishes sequences that reached a
stop string, and returns each advanced sequence with its newly streamable text.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from hwplug.errors import ModelError
from hwplug.model_zoo.engine.model_runner import ModelRunner
from hwplug.model_zoo.engine.output import Detokenizer, Output
from hwplug.model_zoo.engine.scheduler import Scheduler
from hwplug.model_zoo.engine.sequence import FinishReason, Sequence
from hwplug.model_zoo.sampling import SamplingParams


class LLMEngine:
    """A :class:`Scheduler` and a :class:`ModelRunner` sharing one KV cache."""

    def __init__(self, runner: ModelRunner, scheduler: Scheduler, tokenizer: Any) -> None:
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        self._detokenizers: dict[int, Detokenizer] = {}

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(self, prompt_ids: Seq[int], sampling: SamplingParams) -> Sequence:
        """Queue a prompt. Raises :class:`ModelError` when it is empty, does not fit the
        model's context, or could never fit the KV cache."""
        if not prompt_ids:
            raise ModelError("the prompt is empty: it must hold at least one token")
        if len(prompt_ids) >= self.max_model_len:
            raise ModelError(f"the prompt has {len(prompt_ids)} tokens but the model's context "
                             f"holds {self.max_model_len} (max_position_embeddings), and at "
                             "least one must be left to generate")
        blocks = self.scheduler.block_manager
        longest = min(len(prompt_ids) + sampling.max_tokens, self.max_model_len)
        if blocks.blocks_for(longest) > blocks.num_blocks:
            raise ModelError(f"a request of up to {longest} tokens needs "
                             f"{blocks.blocks_for(longest)} KV blocks but the cache has "
                             f"{blocks.num_blocks} of {blocks.block_size} tokens; lower "
                             "max_tokens or give the LLM more num_kv_blocks")
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(self.runner.device).manual_seed(sampling.seed)
        seq = Sequence(list(prompt_ids), sampling, generator)
        self._detokenizers[seq.seq_id] = Detokenizer(self.tokenizer, prompt_ids, sampling.stop)
        self.scheduler.add(seq)
        return seq

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[tuple[Sequence, str]]:
        """One step; each sequence that got a token, with its new streamable text."""
        batch = self.scheduler.schedule()
        if not batch:
            raise ModelError("no waiting request fits the free KV cache and nothing is "
                             "running to free it")
        tokens = self.runner.step(batch)
        advanced = self.scheduler.update(batch, tokens)
        result = []
        for seq in advanced:
            detokenizer = self._detokenizers[seq.seq_id]
            if detokenizer.add_token(seq.token_ids[-1]) and not seq.is_finished:
                self.scheduler.finish(seq, FinishReason.STOP)
            result.append((seq, detokenizer.stream(seq.is_finished)))
        return result

    def pop_output(self, seq: Sequence) -> Output:
        """The finished ``seq``'s :class:`Output` (its detokenizer is released)."""
        text = self._detokenizers.pop(seq.seq_id).text
        return Output(text=text, token_ids=seq.output_token_ids,
                      finish_reason=str(seq.finish_reason), num_prompt_tokens=seq.num_prompt_tokens)

    def abort(self, seq: Sequence) -> None:
        """Drop a request before it finishes (e.g. a stream closed early)."""
        if not seq.is_finished:
            self.scheduler.finish(seq, FinishReason.ABORT)
        self._detokenizers.pop(seq.seq_id, None)
