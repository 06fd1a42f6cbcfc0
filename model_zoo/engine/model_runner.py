"""``ModelRunner``: one scheduled step of a model-zoo model over the paged KV cache.

The runner owns one KV cache per layer (shape from the attention backend's
``kv_cache_shape``, dtype ``ctx.engine_config.kv_cache_dtype``). For a step it builds the flat
inputs and :class:`~hwplug.attention.AttentionMetadata` of the whole mixed batch
(prefill chunks and decode tokens together) from plain lists, one ``torch.tensor`` call
per tensor, runs the model under ``torch.inference_mode()``, computes logits only for
the last token of each sequence that samples, and samples them. With ``step_graphs``, on a
platform that can replay steps (:meth:`~hwplug.Platform.step_recorder`), a pure decode
step, or a speculative verify step (every sequence scoring its proposals and the token
after them), replays a recorded step graph instead
(:class:`~hwplug.model_zoo.engine.decode_graphs.DecodeGraphs`) where its kernels allow one.
"""

from __future__ import annotations

import logging
import math
import mmap
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from torch import nn

from hwplug.attention import AttentionMetadata
from hwplug.dtypes import torch_dtype
from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.engine.decode_graphs import DecodeGraphs
from hwplug.model_zoo.engine.device_sampling import DeviceSampling
from hwplug.model_zoo.engine.logprobs import record_prompt_logprobs, top_logprobs
from hwplug.model_zoo.engine.prefill_graphs import PrefillGraphs
from hwplug.model_zoo.engine.scheduler import ScheduledBatch
from hwplug.model_zoo.engine.sequence import Sequence
from hwplug.model_zoo.engine.speculation import verify
from hwplug.model_zoo.sampling import SamplingRow, sample
from hwplug.step_replay import SampledTokens, SampleRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphLimits:
    """The steps :class:`ModelRunner` records step graphs for: decode batches of up to
    ``max_num_seqs`` sequences of up to ``max_model_len`` tokens, and verify steps of up to
    ``rows_per_seq`` tokens per sequence (``k + 1`` under speculative decoding with ``k``
    proposals; 1: none); where the platform's recorder records prefill steps too, those of
    up to ``max_num_batched_tokens`` tokens (None: no prefill graphs)."""

    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int | None = None
    rows_per_seq: int = 1


@dataclass
class StepInputs:
    """A step's flat model inputs: ``input_ids``/``positions [T]`` int64, the metadata,
    and ``sample_rows`` — the token index of each sampled sequence's last token (None
    when every sequence samples from its last token, i.e. a pure decode step)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    sample_rows: torch.Tensor | None


def slot(block_table: Seq[int], position: int, block_size: int) -> int:
    """The KV cache slot of the token at ``position`` of a sequence with ``block_table``."""
    return block_table[position // block_size] * block_size + position % block_size


class ModelRunner:
    """Runs steps of ``model`` with ``num_blocks`` KV blocks per layer; decode steps of up
    to ``step_graphs.max_num_seqs`` sequences of up to ``max_model_len`` tokens replay step
    graphs when ``step_graphs`` is given and the platform has a step recorder (else
    :attr:`graphs` is None and nothing is ever recorded). The platform may keep the weights
    and the KV caches on its device (:meth:`~hwplug.Platform.place_state`); with
    ``host_kv_caches`` the caches stay in their torch tensors, for a reader outside the
    model (a KV connector)."""

    def __init__(self, model: nn.Module, ctx: ModelContext, num_blocks: int,
                 generator: torch.Generator | None = None,
                 step_graphs: GraphLimits | None = None, host_kv_caches: bool = False) -> None:
        self.model, self.ctx = model, ctx
        self.device = ctx.device
        self.generator = generator
        # speculative decoding's verification (bound once, like every op of the step)
        self._rejection_sample = ctx.kernels.bind("rejection_sample", "float32")
        engine = ctx.engine_config
        self.block_size: int = engine.block_size
        shape = ctx.attention_backend.kv_cache_shape(num_blocks, self.block_size,
                                                     engine.num_kv_heads, engine.head_size)
        dtype = torch_dtype(engine.kv_cache_dtype)
        # zeroed: attention reads whole blocks and masks the unused slots, so they must
        # hold finite values
        self.kv_caches = [zeros_on_demand(shape, dtype, self.device)
                          for _ in range(model.num_layers)]
        # the weights, and the caches unless something reads them in torch (a KV connector
        # moving their blocks: host_kv_caches), where the platform computes
        ctx.platform.place_state([*model.parameters(), *model.buffers()],
                                 [] if host_kv_caches else self.kv_caches)
        #: The decode step graphs (None: every step runs eagerly).
        recorder = ctx.platform.step_recorder()
        self.graphs = None if step_graphs is None or recorder is None else DecodeGraphs(
            self._logits, recorder, step_graphs.max_num_seqs, step_graphs.max_model_len,
            self.block_size, step_graphs.rows_per_seq, self.device)
        #: The prefill step graphs (None: prefill steps run eagerly).
        self.prefill_graphs = None if (
            self.graphs is None or step_graphs is None or not recorder.records_prefill
            or step_graphs.max_num_batched_tokens is None) else PrefillGraphs(
            self._sampled_logits, recorder, step_graphs.max_num_batched_tokens,
            step_graphs.max_num_seqs, step_graphs.max_model_len, self.block_size)
        #: Sampling on the platform's device (None: every step samples in torch).
        sampler = ctx.platform.device_sampler()
        self.device_sampling = None if sampler is None else DeviceSampling(sampler,
                                                                           generator)

    def prepare(self, seqs: Seq[Sequence], num_new_tokens: Seq[int]) -> StepInputs:
        """Inputs of a step in which ``seqs[i]`` computes its next ``num_new_tokens[i]``
        tokens (their blocks must be allocated), its ``spec_token_ids`` after its tokens.
        A sequence that samples has one sample row, or ``k + 1`` with ``k`` proposals."""
        block_size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        sample_rows: list[int] = []
        for seq, num_new in zip(seqs, num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            end = start + num_new
            table = seq.block_table
            proposed = seq.spec_token_ids
            tokens = seq.token_ids + proposed if proposed else seq.token_ids
            input_ids += tokens[start:end]
            positions += range(start, end)
            slots += [slot(table, p, block_size) for p in range(start, end)]
            seq_lens.append(end)
            starts.append(starts[-1] + num_new)
            if end == len(tokens):  # a verify step scores every proposal and the next
                sample_rows += range(starts[-1] - 1 - len(proposed), starts[-1])
        width = max(len(seq.block_table) for seq in seqs)
        tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs]
        device = self.device
        metadata = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            max_query_len=max(num_new_tokens), max_seq_len=max(seq_lens))
        every_token_samples = len(sample_rows) == len(input_ids)
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            metadata=metadata,
            sample_rows=None if every_token_samples else torch.tensor(sample_rows,
                                                                      device=device))

    @torch.inference_mode()
    def forward(self, inputs: StepInputs, **model_kwargs: torch.Tensor) -> torch.Tensor:
        """Hidden states ``[T, hidden]`` of every token of the step."""
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.metadata,
                          **model_kwargs)

    def _logits(self, input_ids: torch.Tensor, positions: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        """Logits of every token of a step (a decode step graph's body)."""
        return self.model.compute_logits(self.model(input_ids, positions, self.kv_caches,
                                                    metadata))

    def _sampled_logits(self, input_ids: torch.Tensor, positions: torch.Tensor,
                        metadata: AttentionMetadata, sample_rows: torch.Tensor
                        ) -> torch.Tensor:
        """Logits of the ``sample_rows`` tokens of a step (a prefill step graph's body)."""
        hidden = self.model(input_ids, positions, self.kv_caches, metadata)
        return self.model.compute_logits(hidden[sample_rows])

    def _replay(self, batch: ScheduledBatch, device: DeviceSampling | None,
                request: SampleRequest | None) -> list[int] | torch.Tensor | None:
        """``batch`` from a step graph: its tokens sampled on the device as ``request`` says
        (by ``device``), else its logits; None when it runs eagerly (see
        :class:`DecodeGraphs` and :class:`PrefillGraphs`). A decode step (every sequence
        sampling from one new token) or a verify step (from its proposals and the token
        after them) replays as one decode row per token (see
        :mod:`~hwplug.model_zoo.engine.decode_graphs`); other steps as prefill steps."""
        seqs = batch.seqs
        if self.graphs is None:
            return None
        if not batch.is_decode:
            if any(seq.spec_token_ids for seq in seqs):
                logger.debug("a verify step runs eagerly: its batch also prefills (a "
                             "sequence computes tokens before its last)")
                return None
            return self._replay_prefill(batch, device, request)
        token_ids, positions, slots, tables = [], [], [], []
        for seq, num_new in zip(seqs, batch.num_new_tokens, strict=True):
            start, table = seq.num_computed_tokens, seq.block_table
            token_ids += seq.token_ids[start:] + seq.spec_token_ids  # every one samples
            positions += range(start, start + num_new)
            slots += [slot(table, p, self.block_size) for p in range(start, start + num_new)]
            tables += [table] * num_new
        verifying = len(token_ids) > len(seqs)
        if verifying or device is None or request is None:
            return self.graphs.logits(token_ids, positions, slots, tables, verify=verifying)
        sampled = self.graphs.sample(token_ids, positions, slots, tables, request)
        return None if sampled is None else device.accept(sampled, seqs)

    def _replay_prefill(self, batch: ScheduledBatch, device: DeviceSampling | None,
                        request: SampleRequest | None) -> list[int] | torch.Tensor | None:
        """A step that is not a pure decode step from a prefill step graph, or None."""
        if self.prefill_graphs is None or any(
                seq.prompt_logprobs is not None for seq in batch.seqs):
            return None
        inputs = self.prepare(batch.seqs, batch.num_new_tokens)
        rows = inputs.sample_rows
        if rows is None:
            rows = torch.arange(inputs.input_ids.shape[0])
        if request is None and not batch.sampled_seqs and self.device_sampling is not None:
            request = SampleRequest((), (), (), (), ())  # nothing samples: one program
        out = self.prefill_graphs.run(inputs.input_ids, inputs.positions, inputs.metadata,
                                      rows, request)
        if not isinstance(out, SampledTokens):
            return out
        return device.accept(out, batch.sampled_seqs) if device is not None else []

    @torch.inference_mode()
    def step(self, batch: ScheduledBatch, replay: bool = True) -> list[int | list[int]]:
        """Run ``batch``; returns the next token of each of ``batch.sampled_seqs``, or
        for one with proposals (``spec_token_ids``) the tokens its verification keeps
        (:func:`~hwplug.model_zoo.engine.speculation.verify`).

        ``replay=False`` runs it eagerly even when a step graph could serve it (the model's
        Python, its layers' hooks included, runs: a step loading KV blocks needs that).
        The log-probabilities sequences asked for are appended to their ``logprobs`` and
        ``prompt_logprobs`` (taken from the logits before sampling changes them). Where
        the platform samples on its device and every sampled row allows it, the step
        samples there (:mod:`~hwplug.model_zoo.engine.device_sampling`).
        """
        sampled = batch.sampled_seqs
        device = self.device_sampling
        if device is not None and not (sampled and device.serves(sampled)):
            device = None
        request = None if device is None else device.request(sampled)
        replayed = self._replay(batch, device, request) if replay else None
        if isinstance(replayed, list):
            return replayed
        logits = replayed
        if logits is not None and not sampled:
            return []
        if logits is None:
            inputs = self.prepare(batch.seqs, batch.num_new_tokens)
            hidden = self.forward(inputs)
            record_prompt_logprobs(batch.seqs, batch.num_new_tokens, hidden,
                                   self.model.compute_logits)
            if not sampled:
                return []
            if inputs.sample_rows is not None:
                hidden = hidden[inputs.sample_rows]
            logits = self.model.compute_logits(hidden)
        if device is not None and request is not None:
            return device.accept(device.sampler.sample(logits, request), sampled)
        if any(seq.spec_token_ids for seq in sampled):
            return verify(logits, sampled, self.generator, self._sample,
                          self._rejection_sample)
        return self._sample(logits, sampled)

    def _sample(self, logits: torch.Tensor, sampled: list[Sequence]) -> list[int]:
        """The next token of each of ``sampled`` from its row of ``logits``."""
        wanted = [i for i, seq in enumerate(sampled) if seq.logprobs is not None]
        raw = logits[wanted] if wanted else None  # a copy: sample() edits logits in place
        for i, seq in enumerate(sampled):
            if seq.guide is not None:  # structured output: only the grammar's next tokens
                seq.guide.mask(logits[i])
        rows = [SamplingRow(seq.sampling, seq.generator, seq.token_ids, seq.num_prompt_tokens)
                for seq in sampled]
        tokens = sample(logits, rows, self.generator).tolist()
        if raw is not None:
            found = top_logprobs(raw, [tokens[i] for i in wanted],
                                 [sampled[i].sampling.logprobs for i in wanted])
            for i, row in zip(wanted, found, strict=True):
                sampled[i].logprobs.append(row)
        return tokens


def zeros_on_demand(shape: Seq[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros of ``shape`` and ``dtype`` on ``device``. On the CPU they view an anonymous
    mapping, which reads as zeros and takes memory page by page as it is first written:
    allocating a KV cache then costs neither time nor resident memory up front (writing
    ``torch.zeros`` touches every page, ~0.4 s for a 3B model's 4096-token cache)."""
    count = math.prod(shape)
    if torch.device(device).type != "cpu" or count == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, count * dtype.itemsize)
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(tuple(shape))
