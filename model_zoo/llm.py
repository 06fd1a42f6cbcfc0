"""``LLM``: load a model once on the resolved platform, then generate, stream, chat or embed.

``LLM(model)`` resolves ``model`` (a path or an alias; None = the default model) with the
loaders, builds it with :func:`~hwplug.model_zoo.context.build_model` (the platform
settles the attention backend and the block size), allocates one paged KV cache per
layer and keeps the tokenizer. Decoders serve :meth:`LLM.generate`, :meth:`LLM.stream`
and :meth:`LLM.chat` through the continuous-batching :class:`LLMEngine`; encoders serve
:meth:`LLM.embed`. Calling one kind's method on the other kind is a
:class:`~hwplug.errors.ModelError`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import Any

import torch
import torch.nn.functional as F

from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.engine import (
    BlockManager,
    LLMEngine,
    ModelRunner,
    Output,
    Scheduler,
    Sequence,
)
from hwplug.model_zoo.engine.model_runner import kv_cache_bytes_per_block
from hwplug.model_zoo.engine.scheduler import check_limits
from hwplug.model_zoo.sampling import SamplingParams

logger = logging.getLogger(__name__)

#: Share of the platform's free memory the KV cache takes when ``num_kv_blocks`` is None.
DEFAULT_KV_CACHE_FRACTION = 0.02

Prompt = str | Seq[int]
Messages = str | Seq[Mapping[str, str]]


class TextStream:
    """The text of one request, piece by piece as its tokens are produced.

    Iterating runs the engine and yields the new text after each step; when the iteration
    ends, :attr:`output` holds the request's :class:`Output`. Closing the iteration early
    drops the request.
    """

    def __init__(self, engine: LLMEngine, seq: Sequence) -> None:
        self._engine, self._seq = engine, seq
        self.output: Output | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            while not self._seq.is_finished:
                for seq, delta in self._engine.step():
                    if seq is self._seq and delta:
                        yield delta
            self.output = self._engine.pop_output(self._seq)
        finally:
            if self.output is None:
                self._engine.abort(self._seq)


class LLM:
    """A loaded model and its engine.

    ``dtype`` is the compute dtype (``float32``, ``bfloat16``, ``float16``; ``auto``, the
    default, is the platform's best dtype the checkpoint allows: fp32 on a CPU without bf16
    arithmetic, bf16 on a GPU) and ``kv_cache_dtype`` the cache's (default: ``dtype``). At most ``max_num_seqs``
    sequences run at once and a step computes at most ``max_num_batched_tokens`` tokens
    (longer prompts are prefilled in chunks). ``num_kv_blocks`` sizes the KV cache: a
    block count, a fraction in (0, 1) of the platform's free memory, or None for
    :data:`DEFAULT_KV_CACHE_FRACTION`. ``block_size`` and ``attention_backend`` default
    to the platform's choice. ``seed`` seeds sampled requests that carry no seed of
    their own.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, dtype: str = "auto",
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 block_size: int | None = None, num_kv_blocks: int | float | None = None,
                 attention_backend: str | None = None, kv_cache_dtype: str | None = None,
                 seed: int | None = None) -> None:
        from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

        check_limits(max_num_seqs, max_num_batched_tokens)  # before the slow load
        checkpoint = load_checkpoint(resolve_model(model))
        self.model, self.ctx = build_model(
            checkpoint, dtype=dtype, attention_backend=attention_backend,
            block_size=block_size, kv_cache_dtype=kv_cache_dtype)
        self.tokenizer = checkpoint.tokenizer
        self.hf_config = checkpoint.config
        self.architecture: str = self.hf_config.architectures[0]
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        self.max_model_len = int(self.hf_config.max_position_embeddings)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        config = self.ctx.engine_config
        num_blocks = self._num_kv_blocks(num_kv_blocks)
        logger.info("KV cache: %d blocks of %d tokens (%s)", num_blocks, config.block_size,
                    config.kv_cache_dtype)
        generator = torch.Generator(self.ctx.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.runner = ModelRunner(self.model, self.ctx, num_blocks, generator)
        self.engine = LLMEngine(
            self.runner,
            Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens,
                      max_model_len=self.max_model_len,
                      eos_token_ids=checkpoint.eos_token_ids),
            self.tokenizer)

    # --- facts ---------------------------------------------------------------------------

    @property
    def platform(self) -> str:
        return self.ctx.platform.name

    @property
    def attention_backend(self) -> str:
        return str(self.ctx.engine_config.attention_backend)

    @property
    def dtype(self) -> str:
        return self.ctx.engine_config.dtype

    def _num_kv_blocks(self, requested: int | float | None) -> int:
        """Blocks per layer: as requested, or the memory share capped at what
        ``max_num_seqs`` full-length sequences (encoders: one batch) can use."""
        if isinstance(requested, int) and not isinstance(requested, bool):
            if requested < 1:
                raise ConfigError(f"num_kv_blocks must be >= 1 (a block count) or a fraction "
                                  f"in (0, 1), got {requested}")
            return requested
        fraction = DEFAULT_KV_CACHE_FRACTION if requested is None else requested
        if not 0 < fraction < 1:
            raise ConfigError(f"num_kv_blocks as a fraction of free memory must be in (0, 1), "
                              f"got {fraction}")
        block_size = self.ctx.engine_config.block_size
        per_seq = -(-self.max_model_len // block_size)
        if self.is_encoder:  # one batch at a time, freed after it
            useful = -(-max(self.max_num_batched_tokens, self.max_model_len) // block_size)
            return useful + self.max_num_seqs
        free = self.ctx.platform.memory_info().free
        share = int(fraction * free) // kv_cache_bytes_per_block(self.ctx, self.model.num_layers)
        return max(per_seq, min(share, per_seq * self.max_num_seqs))

    def _require(self, encoder: bool, method: str) -> None:
        if self.is_encoder == encoder:
            return
        if self.is_encoder:
            raise ModelError(f"{method} needs a decoder model, but {self.architecture} is an "
                             "encoder: use embed()")
        raise ModelError(f"{method} needs an encoder model (e.g. all-minilm-l6-v2), but "
                         f"{self.architecture} is a decoder: use generate()")

    # --- generation ----------------------------------------------------------------------

    def tokenize(self, prompt: Prompt) -> list[int]:
        """Token ids of a text prompt (with the tokenizer's special tokens); token ids pass
        through."""
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        return [int(token) for token in prompt]

    def apply_chat_template(self, messages: Messages) -> list[int]:
        """Token ids of a conversation (a user message, or ``[{"role", "content"}, ...]``)
        formatted by the tokenizer's chat template, ready for the assistant's turn."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if not getattr(self.tokenizer, "chat_template", None):
            raise ModelError(f"the tokenizer of {self.architecture} has no chat template")
        text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                  add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def generate(self, prompts: Prompt | Seq[Prompt],
                 sampling: SamplingParams | Seq[SamplingParams] | None = None) -> list[Output]:
        """Complete each prompt (a string or a list of token ids); one :class:`Output` per
        prompt, in order. ``sampling`` is shared, or one per prompt."""
        self._require(encoder=False, method="generate()")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        token_ids = [self.tokenize(prompt) for prompt in prompts]
        if sampling is None or isinstance(sampling, SamplingParams):
            params = [sampling or SamplingParams()] * len(token_ids)
        else:
            params = list(sampling)
            if len(params) != len(token_ids):
                raise ConfigError(f"got {len(params)} SamplingParams for {len(token_ids)} "
                                  "prompts; pass one, or one per prompt")
        seqs: list[Sequence] = []
        try:
            for ids, param in zip(token_ids, params, strict=True):
                seqs.append(self.engine.add_request(ids, param))
            while not all(seq.is_finished for seq in seqs):
                self.engine.step()
            return [self.engine.pop_output(seq) for seq in seqs]
        finally:
            for seq in seqs:
                if not seq.is_finished:
                    self.engine.abort(seq)

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None) -> TextStream:
        """The completion of one prompt as a :class:`TextStream` of text pieces."""
        self._require(encoder=False, method="stream()")
        seq = self.engine.add_request(self.tokenize(prompt), sampling or SamplingParams())
        return TextStream(self.engine, seq)

    def chat(self, messages: Messages, sampling: SamplingParams | None = None) -> Output:
        """The assistant's reply to a conversation (see :meth:`apply_chat_template`)."""
        return self.generate([self.apply_chat_template(messages)], sampling)[0]

    # --- embedding -----------------------------------------------------------------------

    def embed(self, texts: str | Seq[str]) -> torch.Tensor:
        """L2-normalised mean-pooled sentence embeddings ``[N, hidden]`` float32."""
        self._require(encoder=True, method="embed()")
        texts = [texts] if isinstance(texts, str) else list(texts)
        encoded = [self.tokenizer(text) for text in texts]
        for text, item in zip(texts, encoded, strict=True):
            if len(item.input_ids) > self.max_model_len:
                raise ModelError(f"the text {text[:40]!r}... has {len(item.input_ids)} tokens "
                                 f"but the model's context holds {self.max_model_len}")
        pooled = [self._embed_batch(encoded[start:end])
                  for start, end in self._batches([len(e.input_ids) for e in encoded])]
        return F.normalize(torch.cat(pooled).float(), dim=-1)

    def _batches(self, lengths: list[int]) -> Iterator[tuple[int, int]]:
        """``[start, end)`` runs of texts within the step limits (at least one text each)."""
        start, tokens = 0, 0
        for index, length in enumerate(lengths):
            if index > start and (tokens + length > self.max_num_batched_tokens
                                  or index - start == self.max_num_seqs):
                yield start, index
                start, tokens = index, 0
            tokens += length
        if lengths:
            yield start, len(lengths)

    def _embed_batch(self, encoded: list[Any]) -> torch.Tensor:
        """Mean of each text's token hidden states ``[n, hidden]`` (one forward pass)."""
        seqs = [Sequence(list(item.input_ids)) for item in encoded]
        lengths = [seq.num_tokens for seq in seqs]
        try:
            for seq in seqs:
                if not self.block_manager.allocate(seq, seq.num_tokens):
                    raise ModelError("the KV cache cannot hold one embedding batch")
            inputs = self.runner.prepare(seqs, lengths)
            types = [token for item in encoded
                     for token in item.get("token_type_ids", [0] * len(item.input_ids))]
            hidden = self.runner.forward(inputs, token_type_ids=torch.tensor(
                types, dtype=torch.int64, device=self.ctx.device))
        finally:
            for seq in seqs:
                self.block_manager.free(seq)
        return torch.stack([part.mean(dim=0) for part in hidden.split(lengths)])
