"""Prefill steps replayed from step graphs, on a platform whose recorder records them
(``StepRecorder.records_prefill``: hwplug-tpu, which compiles each into one XLA program).

A step that is not a pure decode step (prompts, chunks of prompts, decode tokens beside
them) of ``T`` tokens over ``S`` sequences runs as the graph of its bucket ``(T', S')``:
the powers of two >= ``T`` and ``S``. The graph's body is the model's forward pass over
the bucket's tokens and the logits of ``S'`` rows (``sample_rows``: the last token of each
sequence that samples, then row 0 for the rest), recorded once per bucket and replayed
with the step written into the bucket's static inputs. Padding: tokens past ``T`` are
token 0 at position 0, slot -1 (not written) and belong to no sequence; sequences past
``S`` have no tokens and no context (their ``query_start_loc`` repeats ``T``). The
attention's static query bound is ``T'`` for every step of the bucket.

As decode graphs, a bucket is recorded twice over different contents (one sequence
holding every token; the tokens spread over every sequence slot, at the end of the
longest contexts) and kept only when both recordings did the same (else its steps run
eagerly, the reason logged). Steps this does not serve run eagerly: one in which a
sequence asks for prompt log-probabilities (they need every row's logits), a verify step,
one with more tokens or sequences than the limits, or a block table wider than
``max_model_len`` needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hwplug.attention import AttentionMetadata
from hwplug.model_zoo.engine.decode_graphs import record_step, record_twice, refusal
from hwplug.step_replay import RecordedStep, SampledTokens, SampleRequest, StepRecorder

logger = logging.getLogger(__name__)

#: ``body(input_ids, positions, metadata, sample_rows) -> logits [len(sample_rows), V]``.
Body = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor]


def _bucket(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass
class _Inputs:
    """A bucket's static inputs."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sample_rows: torch.Tensor

    @classmethod
    def empty(cls, tokens: int, seqs: int, max_blocks: int) -> _Inputs:
        return cls(
            torch.zeros(tokens, dtype=torch.int64), torch.zeros(tokens, dtype=torch.int64),
            AttentionMetadata(
                slot_mapping=torch.full((tokens,), -1, dtype=torch.int64),
                block_tables=torch.zeros((seqs, max_blocks), dtype=torch.int32),
                seq_lens=torch.zeros(seqs, dtype=torch.int32),
                query_start_loc=torch.zeros(seqs + 1, dtype=torch.int32),
                max_query_len=tokens, max_seq_len=tokens),
            torch.zeros(seqs, dtype=torch.int64))

    def fill(self, input_ids: torch.Tensor, positions: torch.Tensor,
             metadata: AttentionMetadata, sample_rows: torch.Tensor) -> None:
        """The step's inputs, then padding (see the module docstring)."""
        tokens, seqs = input_ids.shape[0], metadata.seq_lens.shape[0]
        width = metadata.block_tables.shape[1]
        for static, given, pad in ((self.input_ids, input_ids, 0),
                                   (self.positions, positions, 0),
                                   (self.metadata.slot_mapping, metadata.slot_mapping, -1),
                                   (self.metadata.seq_lens, metadata.seq_lens, 0),
                                   (self.sample_rows, sample_rows, 0)):
            static[:given.shape[0]] = given
            static[given.shape[0]:] = pad
        self.metadata.block_tables.zero_()
        self.metadata.block_tables[:seqs, :width] = metadata.block_tables
        self.metadata.query_start_loc[:seqs + 1] = metadata.query_start_loc
        self.metadata.query_start_loc[seqs + 1:] = tokens


class PrefillGraphs:
    """Step graphs of ``body`` for steps of up to ``max_tokens`` tokens over up to
    ``max_num_seqs`` sequences of up to ``max_model_len`` tokens in blocks of
    ``block_size``, recorded by ``recorder`` (see the module docstring)."""

    def __init__(self, body: Body, recorder: StepRecorder, max_tokens: int, max_num_seqs: int,
                 max_model_len: int, block_size: int) -> None:
        self.body, self.recorder = body, recorder
        self.max_tokens, self.max_num_seqs = max_tokens, max_num_seqs
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self._graphs: dict[tuple[int, int], tuple[RecordedStep, _Inputs]] = {}
        #: (tokens, sequences) bucket -> why its steps run eagerly.
        self.refused: dict[tuple[int, int], str] = {}
        #: Steps served by a replay.
        self.replays = 0

    @property
    def recorded(self) -> list[tuple[int, int]]:
        """The (tokens, sequences) buckets recorded so far."""
        return sorted(self._graphs)

    def describe(self) -> str:
        """One line: the buckets replayed and the steps they served, the refused ones."""
        parts = [f"prefill steps of up to (tokens, sequences) "
                 f"{', '.join(map(str, self.recorded)) or 'none'} replayed ({self.replays} "
                 "steps)"]
        parts += [f"{bucket} runs eagerly ({why})" for bucket, why in sorted(self.refused.items())]
        return "; ".join(parts)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor,
            metadata: AttentionMetadata, sample_rows: torch.Tensor,
            request: SampleRequest | None) -> SampledTokens | torch.Tensor | None:
        """The step (its flat inputs as the runner prepares them; ``sample_rows``: the token
        index of each sampled sequence's last token) from its bucket's graph: its tokens
        sampled on the device as ``request`` says, or without one the logits of
        ``sample_rows``; None when the step runs eagerly."""
        tokens, seqs = input_ids.shape[0], metadata.seq_lens.shape[0]
        if (tokens > self.max_tokens or seqs > self.max_num_seqs
                or metadata.block_tables.shape[1] > self.max_blocks):
            return None
        bucket = (_bucket(tokens), _bucket(seqs))
        if bucket in self.refused:
            return None
        entry = self._graphs.get(bucket) or self._record(bucket)
        if entry is None:
            return None
        graph, inputs = entry
        inputs.fill(input_ids, positions, metadata, sample_rows)
        self.replays += 1
        if request is not None:
            return graph.replay_sampled(request)  # type: ignore[attr-defined]
        return graph.replay()[:sample_rows.shape[0]]

    def _record(self, bucket: tuple[int, int]) -> tuple[RecordedStep, _Inputs] | None:
        tokens, seqs = bucket
        inputs = _Inputs.empty(tokens, seqs, self.max_blocks)

        def recording(metadata: AttentionMetadata) -> RecordedStep:
            return record_step(self.recorder, lambda: self.body(
                inputs.input_ids, inputs.positions, metadata, inputs.sample_rows))

        def one_sequence() -> RecordedStep:
            inputs.metadata.seq_lens[0] = tokens
            inputs.metadata.query_start_loc[1:] = tokens
            inputs.positions.copy_(torch.arange(tokens))
            inputs.sample_rows.fill_(tokens - 1)
            return recording(inputs.metadata)

        def spread() -> RecordedStep:
            # other contents: the tokens over every sequence, at the end of the longest
            # contexts, other token ids and (negative, unwritten) slots
            share = tokens // seqs
            inputs.input_ids.fill_(1)
            inputs.metadata.slot_mapping.fill_(-2)
            inputs.metadata.seq_lens.fill_(self.max_model_len)
            inputs.metadata.query_start_loc.copy_(torch.arange(seqs + 1) * share)
            inputs.metadata.query_start_loc[-1] = tokens
            inputs.positions.fill_(self.max_model_len - 1)
            inputs.sample_rows.copy_(inputs.metadata.query_start_loc[1:] - 1)
            return recording(replace(inputs.metadata, max_seq_len=self.max_model_len))

        try:
            second = record_twice(self.recorder, one_sequence, spread)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the eager step decides
            self.refused[bucket] = refusal(f"prefill steps of {bucket} (tokens, sequences)",
                                           exc)
            return None
        self._graphs[bucket] = (second, inputs)
        logger.info("prefill steps of up to %d tokens over %d sequences replay a recorded "
                    "step (%s)", tokens, seqs, self.recorder.name)
        return second, inputs
