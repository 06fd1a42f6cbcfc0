"""Decode steps replayed from step graphs, recorded by the platform's
:class:`~hwplug.step_replay.StepRecorder` (on CPUs: :mod:`hwplug.platforms.cpu.step_graph`;
on NVIDIA GPUs: ``hwplug_cuda.cuda_graph``).

A pure decode step (one new token per sequence, each sampling) of ``n`` sequences runs as
the graph of the smallest bucket of :data:`BUCKETS` that holds ``n``: the forward pass and
the logits, recorded once per bucket (as the native kernel calls they make on CPUs, as a
CUDA graph on NVIDIA GPUs) and replayed from then on, with the step's token ids,
positions, slots, block tables and lengths written into the bucket's static input tensors
(on the model's device). On a platform that samples on its device
(:mod:`~hwplug.model_zoo.engine.device_sampling`) the replay samples the logits there
too (:meth:`DecodeGraphs.sample`). Rows past ``n`` are padding: token 0 at
position 0, slot -1 (not written), one token of block 0 (read, never written).

A bucket is recorded at its :data:`RECORD_AT`-th decode step; the steps before run eagerly,
so a generation of one token (a cold start's ``--max-tokens 1``), or a batch size met once,
never pays for the recordings (two runs of the step's Python; what else a recording costs
is the recorder's: the CPU one keeps the native calls without making them).
:meth:`DecodeGraphs.record_all` records the batch buckets and the verify buckets of ``k``
proposals ahead instead (a server's warm-up), so no such step pays for a recording or runs
eagerly before it; the verify buckets of fewer proposals (below) are still recorded at
their :data:`RECORD_AT`-th step, so a server records and holds only those its traffic
meets. A bucket is recorded twice, over the shortest context (one token) and the longest
(``max_model_len`` tokens, every block table entry block 0) with other tokens and slots,
and kept only when the recorder finds both the same (``StepRecorder.check_same``; on CPUs
the same calls: a kernel chosen in Python from a step's lengths would change between them;
for CUDA graphs see ``hwplug_cuda.cuda_graph``). A recorder that
asks for it (``warms_up``: CUDA graphs) gets each recording's step run once eagerly right
before it. The recordings (and warm-ups) write no KV (every slot negative); a warm-up
before the long recording costs one attention pass over ``max_model_len`` tokens per
sequence of the bucket, once. A
bucket whose step computes anything in torch (a platform or model without native kernels
for every op) is refused once, with the reason logged, and its steps run eagerly; so does
one whose recording failed in any other way (logged as a warning: the eager step then
raises whatever the model raises).

A speculative verify step (sequence ``i`` scoring ``k_i + 1`` tokens on its context, every
one sampling) runs as the decode batch of its ``sum(k_i + 1)`` query rows: row ``j`` of
sequence ``i`` is a decode row of its own (its token, position and slot, context up to and
including its position, sequence ``i``'s blocks), exactly what
:meth:`~hwplug.attention.AttentionMetadata.decode_rows` makes of it on the eager path.
Under a causal mask the rows of one sequence see each other's keys because the step
writes every row's KV before any attention reads it. With ``rows_per_seq = k + 1`` the
buckets add ``b * (j + 1)`` rows for each batch bucket ``b`` and each ``j`` from 1 to
``k``, so a verify step of ``b`` sequences with ``j`` proposals each replays without
padding, and one with mixed lengths takes the next bucket up. Every padding row costs
what a row does: on SmolLM2 Q4_1 (2-vCPU Zen 4), a one-proposal step padded to ``k + 1 =
5`` rows took 11.4 ms against 7.4 for a one-row step and 13.6 for five rows. A step that
cannot replay (more rows than the last bucket, a block table past ``max_model_len``, a
refused bucket) runs eagerly, and says why at debug level.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from hwplug.attention import AttentionMetadata
from hwplug.errors import UnsupportedError
from hwplug.step_replay import RecordedStep, SampledTokens, SampleRequest, StepRecorder

logger = logging.getLogger(__name__)

#: The batch sizes recorded (a step of n sequences runs in the first bucket >= n; the last
#: bucket is ``max_num_seqs`` when that is smaller; larger steps run eagerly).
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: The decode step of a bucket (counting from 1) at which it is recorded and first replayed.
RECORD_AT = 2


def record_step(recorder: StepRecorder, body: Callable[[], Any]) -> RecordedStep:
    """``body()`` recorded by ``recorder`` as one step whose outputs are what it returned;
    run once eagerly first where the recorder asks for that (``warms_up``)."""
    if getattr(recorder, "warms_up", False):
        body()
    with recorder.record() as graph:
        graph.outputs = body()
    return graph


def record_twice(recorder: StepRecorder, first: Callable[[], RecordedStep],
                 second: Callable[[], RecordedStep]) -> RecordedStep:
    """Record one step twice over different input contents (``first()`` then ``second()``
    record it) and return the second recording, when ``recorder`` finds both the same;
    raises what recording or the check raised."""
    one = first()
    other = second()
    recorder.check_same(one, other)
    return other


def refusal(steps: str, exc: Exception) -> str:
    """Why ``steps`` (``"decode steps of 4 sequences"``) run eagerly after ``exc`` ended their
    recording: logged (a refusal at info, any other failure as a warning) and returned."""
    unsupported = isinstance(exc, UnsupportedError)
    reason = str(exc) if unsupported else f"recording failed: {type(exc).__name__}: {exc}"
    logger.log(logging.INFO if unsupported else logging.WARNING, "%s run eagerly: %s", steps,
               reason)
    return reason


@dataclass
class _Inputs:
    """A bucket's static inputs (``metadata`` holds the attention ones)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata

    def pad(self, start: int = 0) -> None:
        """Rows ``start`` onward to padding (see the module docstring)."""
        self.input_ids[start:] = 0
        self.positions[start:] = 0
        self.metadata.slot_mapping[start:] = -1
        self.metadata.block_tables[start:, 0] = 0
        self.metadata.seq_lens[start:] = 1


class DecodeGraphs:
    """Step graphs of ``step(input_ids, positions, metadata) -> logits`` for decode batches
    of up to ``max_num_seqs`` sequences of up to ``max_model_len`` tokens in blocks of
    ``block_size``, recorded by ``recorder``, and verify steps of up to ``rows_per_seq``
    (``k + 1``) query rows per sequence (1: no speculation). The buckets' static inputs
    live on ``device``, the model's."""

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor, AttentionMetadata],
                                      torch.Tensor], recorder: StepRecorder,
                 max_num_seqs: int, max_model_len: int, block_size: int,
                 rows_per_seq: int = 1, device: torch.device | str = "cpu") -> None:
        self.step, self.recorder, self.device = step, recorder, torch.device(device)
        self.max_model_len, self.block_size = max_model_len, block_size
        self.rows_per_seq = rows_per_seq
        #: Block table entries of a sequence of ``max_model_len`` tokens.
        self.max_blocks = -(-max_model_len // block_size)
        batches = {b for b in BUCKETS if b < max_num_seqs} | {min(max_num_seqs, BUCKETS[-1])}
        #: Rows per recorded step: the batch buckets, and their verify steps' rows (``b``
        #: sequences with ``j`` proposals each, for every ``j`` up to ``k``).
        self.buckets = sorted(batches | {b * rows for b in batches
                                         for rows in range(2, rows_per_seq + 1)})
        #: The buckets :meth:`record_all` records: the batch buckets, and their verify
        #: steps' rows with ``k`` proposals each.
        self.warm_buckets = sorted(batches | {b * rows_per_seq for b in batches})
        self._graphs: dict[int, tuple[RecordedStep, _Inputs]] = {}
        #: bucket -> why it runs eagerly.
        self.refused: dict[int, str] = {}
        #: Steps served by a replay, and of them verify steps.
        self.replays = self.verify_replays = 0
        #: Decode (and verify) steps that ran eagerly instead (see :meth:`logits`).
        self.eager_steps = 0
        #: bucket -> its steps so far that ran eagerly before it was recorded.
        self._unrecorded: dict[int, int] = {}

    @property
    def recorded(self) -> list[int]:
        """The buckets recorded so far."""
        return sorted(self._graphs)

    @property
    def num_recorded(self) -> int:
        """How many buckets are recorded (safe to read from any thread)."""
        return len(self._graphs)

    def describe(self) -> str:
        """One line: the buckets replayed and the steps they served, the refused ones and
        why."""
        parts = []
        if self._graphs:
            verify = (f", {self.verify_replays} of them verify steps"
                      if self.rows_per_seq > 1 else "")
            parts.append(f"decode batches of up to {', '.join(map(str, self.recorded))} "
                         f"sequences replayed ({self.replays} steps{verify})")
        reasons: dict[str, list[int]] = {}
        for bucket, why in sorted(self.refused.items()):
            reasons.setdefault(why, []).append(bucket)
        parts += [f"batches of up to {', '.join(map(str, buckets))} sequences run eagerly "
                  f"({why})" for why, buckets in reasons.items()]
        return f"step graphs: {'; '.join(parts) or 'none recorded yet (no decode step)'}"

    def record_all(self) -> list[int]:
        """Record every bucket of :attr:`warm_buckets` not recorded or refused yet, so that
        the first steps of every batch size replay; returns the buckets recorded (a refused
        one is logged and left out, see the module docstring). Writes no KV: safe between
        any two steps."""
        for bucket in self.warm_buckets:
            if bucket not in self._graphs and bucket not in self.refused:
                self._record(bucket)
        return self.recorded

    def logits(self, token_ids: Sequence[int], positions: Sequence[int],
               slots: Sequence[int], block_tables: Sequence[Sequence[int]],
               verify: bool = False) -> torch.Tensor | None:
        """Logits ``[n, vocab]`` of a decode step of n rows (row i: token ``token_ids[i]``
        at ``positions[i]``, stored at ``slots[i]``, its sequence's blocks
        ``block_tables[i]``; a verify step, ``verify``, gives each of its query rows), or
        None when that step runs eagerly (a bucket before its :data:`RECORD_AT`-th step, a
        refused bucket, more rows than the last bucket, a block table longer than
        ``max_blocks``; logged at debug level)."""
        graph = self._filled(token_ids, positions, slots, block_tables)
        if graph is None:
            self.eager_steps += 1
            return None
        self.replays += 1
        self.verify_replays += verify
        return graph.replay()[:len(token_ids)]

    def sample(self, token_ids: Sequence[int], positions: Sequence[int],
               slots: Sequence[int], block_tables: Sequence[Sequence[int]],
               request: SampleRequest) -> SampledTokens | None:
        """The tokens of the same decode step sampled on the device as ``request`` says (the
        recorder's steps must be :class:`~hwplug.step_replay.SamplingStep` s: the platform
        has a device sampler), or None when that step runs eagerly."""
        graph = self._filled(token_ids, positions, slots, block_tables)
        if graph is None:
            self.eager_steps += 1
            return None
        self.replays += 1
        return graph.replay_sampled(request)  # type: ignore[attr-defined]

    def _filled(self, token_ids: Sequence[int], positions: Sequence[int],
                slots: Sequence[int], block_tables: Sequence[Sequence[int]]
                ) -> RecordedStep | None:
        """The graph of the step's bucket with the step written into its static inputs, or
        None (see :meth:`logits`)."""
        n, width = len(token_ids), max(map(len, block_tables))
        at = bisect.bisect_left(self.buckets, n)
        if at == len(self.buckets) or width > self.max_blocks:
            logger.debug("a step of %d rows runs eagerly: %s", n,
                         f"more than the last bucket's {self.buckets[-1]} rows"
                         if at == len(self.buckets) else
                         f"a block table of {width} blocks (> {self.max_blocks})")
            return None
        bucket = self.buckets[at]
        entry = None if bucket in self.refused else self._graphs.get(bucket)
        if entry is None and bucket not in self.refused:
            steps = self._unrecorded[bucket] = self._unrecorded.get(bucket, 0) + 1
            if steps < RECORD_AT:
                logger.debug("a step of %d rows runs eagerly: bucket %d is recorded at its "
                             "step %d", n, bucket, RECORD_AT)
                return None
            entry = self._record(bucket)
        if entry is None:
            logger.debug("a step of %d rows runs eagerly: bucket %d is refused (%s)", n,
                         bucket, self.refused[bucket])
            return None
        graph, inputs = entry
        inputs.pad(n)  # rows a larger step left: they would replay (and write KV) again
        inputs.input_ids[:n] = torch.tensor(token_ids, dtype=torch.int64)
        inputs.positions[:n] = torch.tensor(positions, dtype=torch.int64)
        inputs.metadata.slot_mapping[:n] = torch.tensor(slots, dtype=torch.int64)
        inputs.metadata.seq_lens[:n] = inputs.positions[:n] + 1
        inputs.metadata.block_tables[:n, :width] = torch.tensor(
            [list(table) + [0] * (width - len(table)) for table in block_tables],
            dtype=torch.int32)
        return graph

    def _record(self, bucket: int) -> tuple[RecordedStep, _Inputs] | None:
        on = {"device": self.device}
        inputs = _Inputs(
            torch.zeros(bucket, dtype=torch.int64, **on),
            torch.zeros(bucket, dtype=torch.int64, **on),
            AttentionMetadata(
                slot_mapping=torch.full((bucket,), -1, dtype=torch.int64, **on),
                block_tables=torch.zeros((bucket, self.max_blocks), dtype=torch.int32, **on),
                seq_lens=torch.ones(bucket, dtype=torch.int32, **on),
                query_start_loc=torch.arange(bucket + 1, dtype=torch.int32, **on),
                max_query_len=1, max_seq_len=1))

        def recording(inputs: _Inputs) -> RecordedStep:
            return record_step(self.recorder, lambda: self.step(
                inputs.input_ids, inputs.positions, inputs.metadata))

        def longest() -> RecordedStep:
            # over other contents: the longest context, another token and (negative,
            # unwritten) slot
            inputs.input_ids.fill_(1)
            inputs.positions.fill_(self.max_model_len - 1)
            inputs.metadata.seq_lens.fill_(self.max_model_len)
            inputs.metadata.slot_mapping.fill_(-2)
            return recording(replace(inputs, metadata=replace(
                inputs.metadata, max_seq_len=self.max_model_len)))

        try:
            second = record_twice(self.recorder, lambda: recording(inputs), longest)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the eager step decides
            self.refused[bucket] = refusal(f"decode steps of {bucket} sequences", exc)
            return None
        finally:
            inputs.pad()
        self._graphs[bucket] = (second, inputs)
        logger.info("decode steps of up to %d sequences replay a recorded step (%s)", bucket,
                    self.recorder.name)
        return second, inputs
