"""``LLM``: load a model once on the resolved platform, then generate, stream, chat or embed.

``LLM(model)`` resolves ``model`` (a path or an alias; None = the default model) with the
loaders, builds it with :func:`~hwplug.model_zoo.context.build_model` (the platform
settles the attention backend and the block size), allocates one paged KV cache per
layer and keeps the tokenizer. Decoders serve :meth:`LLM.generate`, :meth:`LLM.stream`
and :meth:`LLM.chat` through the continuous-batching :class:`LLMEngine`, driven by one
:class:`EngineLoop` thread: any number of threads may call them at once, their requests
are batched together and each gets its own output. Encoders serve :meth:`LLM.embed`.
Calling one kind's method on the other kind is a :class:`~hwplug.errors.ModelError`.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Sequence as Seq
from numbers import Integral
from typing import Any

import torch
import torch.nn.functional as F

from hwplug.checks import describe, is_integer
from hwplug.connector import Connector
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
from hwplug.model_zoo.engine.block_hash import model_key, root_hash
from hwplug.model_zoo.engine.engine_loop import EngineLoop, RequestHandle, TextStream
from hwplug.model_zoo.engine.kv_events import KVEventBus
from hwplug.model_zoo.engine.kv_transfer import KVTransfer, build_connector, engine_kv_layout
from hwplug.model_zoo.engine.model_runner import GraphLimits
from hwplug.model_zoo.engine.speculation import build_speculator
from hwplug.model_zoo.engine.zmq_events import ZmqEventPublisher
from hwplug.model_zoo.llm_config import LLMConfig, ResolvedConfig, signature
from hwplug.model_zoo.llm_parallel import Parallelism
from hwplug.model_zoo.loaders.memory import plan_kv_cache, resolve_max_model_len
from hwplug.model_zoo.loaders.resolve import why_dequantized
from hwplug.model_zoo.sampling import SamplingParams
from hwplug.model_zoo.speculative import ProposerTarget
from hwplug.model_zoo.weights_report import summarize, weight_storage
from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

Prompt = str | Seq[int]
Messages = str | Seq[Mapping[str, str]]


class LLM:
    """A loaded model and its engine.

    ``model`` is an alias of a packaged model (``smollm2``, the default when None, or
    ``all-minilm-l6-v2``), a path to a ``.gguf`` file, or a Hugging Face style directory
    (``config.json``, tokenizer files and safetensors weights); nothing is downloaded. The
    other options are keyword arguments declared once in
    :class:`~hwplug.model_zoo.llm_config.LLMConfig` (the CLI's flags), checked first. After
    the model is built, :attr:`config` holds them with what the platform settled (dtype,
    attention backend, block size, quant method, weights' storage, the longest sequence and
    the KV cache with why that size, step graphs).

    A GGUF's weights stay in their GGUF blocks (quant method ``gguf``) unless ``dequantize``
    asks for float weights in ``dtype`` (so does a platform without GGUF kernels).
    ``dtype`` ``auto`` (the default) is the platform's best dtype the checkpoint allows.
    ``max_model_len`` is the longest sequence (prompt and output) served: by default the
    model's context length, at most
    :data:`~hwplug.model_zoo.llm_config.DEFAULT_MAX_MODEL_LEN` tokens; beyond the context,
    or longer than one sequence's KV cache fits in free memory, it is a
    :class:`~hwplug.errors.ConfigError`. ``num_kv_blocks`` sizes the KV cache: a block
    count, a fraction in (0, 1) of the platform's free memory, or None: what
    ``max_num_seqs`` sequences of ``max_model_len`` tokens use, within
    :data:`~hwplug.model_zoo.llm_config.DEFAULT_KV_CACHE_FRACTION` of free memory (and at
    least one such sequence; see :func:`~hwplug.model_zoo.loaders.memory.plan_kv_cache`).
    ``config.kv_cache`` says how large it is and why. A ``block_size`` no attention backend that
    can serve the model accepts is an error listing the sizes they do. Decode steps replay
    step graphs where the platform can (docs/generation.md); ``step_graphs=False``: never.

    Prefix caching reuses the KV of full blocks an earlier request computed (same outputs;
    ``enable_prefix_caching=False``: off); :attr:`kv_events` reports what it stores and
    evicts (also over ZeroMQ at ``kv_events_endpoint``, e.g. ``"tcp://*:5557"``).
    ``kv_connector`` (``shared_storage``, ``cpu_offload``, ``p2p``, or a ``Connector``
    subclass; options ``kv_connector_config``) loads blocks from outside and saves those
    the engine fills; ``kv_load_failure_policy`` (``"fail"`` or ``"recompute"``) says what
    a failed load does (docs/connector-authoring.md).

    Parallelism (docs/generation.md): ``tensor_parallel_size=N`` splits the model over N
    processes (spawned, or torchrun's ranks: rank 0 gets the outputs, the others return a
    worker LLM once it closes); ``data_parallel_size=N`` runs N engine replicas sharing
    each generate call's prompts; a dead worker fails requests with a ``WorkerError``.

    One ``LLM`` may be used from several threads (and, through
    :class:`~hwplug.model_zoo.async_llm.AsyncLLM`, from asyncio) at once: one engine
    thread batches every request and hands each caller its own output. ``LLM`` prints
    nothing (it logs through :mod:`logging`). Invalid arguments raise
    :class:`~hwplug.errors.ConfigError` (:class:`~hwplug.errors.ModelError` for the model
    and prompts) naming the valid values.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, **options: Any) -> None:
        from hwplug.discovery import current_platform
        from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

        config = LLMConfig.create(model=model, **options)  # every option, before the load
        platform = current_platform()
        closers: list[Callable[[], None]] = []
        self._loop = EngineLoop()
        self._shutdown = weakref.finalize(self, _close, self._loop, closers)
        path = resolve_model(config.model)
        #: Why a quantized checkpoint's matrices are held as floats; None when they are not.
        self.dequantized_because = why_dequantized(path, config.dequantize, platform)
        config = config.replace(model=str(path), dequantize=bool(self.dequantized_because))
        #: Tensor/data parallelism of this LLM (``is_worker`` on torchrun ranks > 0).
        self.parallelism = Parallelism(config, platform, closers, self._shutdown)
        # Loading and building run on the engine's thread, where every step runs: a second
        # thread's OpenMP workers would spin on the engine's cores after its last torch call.
        try:
            self._loop.call(lambda: self._build(
                config, platform, lambda: load_checkpoint(path, dequantize=config.dequantize),
                closers))
            self.parallelism.ready(self.is_encoder)
        except BaseException:
            self.close()  # spawned workers too
            raise

    __init__.__signature__ = signature()  # type: ignore[attr-defined]

    def _build(self, options: LLMConfig, platform: Platform, load: Callable[[], Any],
               closers: list[Callable[[], None]]) -> None:
        """Load the checkpoint, build the model, its KV cache and engine (on the engine's
        thread), and hand the engine to the loop."""
        parallel = self.parallelism.start()  # binds this thread, joins the TP group
        checkpoint = load()
        self.model, self.ctx = build_model(checkpoint, platform=platform, parallel=parallel,
                                           config=options)
        config = self.ctx.engine_config
        #: How the model holds its weights, and why (see :mod:`~.weights_report`).
        self.weights = weight_storage(self.model, checkpoint.mapped, self.dequantized_because)
        self.tokenizer = checkpoint.tokenizer
        self.hf_config = checkpoint.config
        self.architecture: str = self.hf_config.architectures[0]
        self.is_encoder = bool(getattr(self.model, "is_encoder", False))
        self.max_model_len, why_length = resolve_max_model_len(
            options.max_model_len, int(self.hf_config.max_position_embeddings))
        self.max_num_seqs = options.max_num_seqs
        self.max_num_batched_tokens = options.max_num_batched_tokens
        if self.parallelism.is_worker:
            return self.parallelism.serve(self.model, self.ctx)  # until rank 0 closes
        #: The KV cache allocated: blocks, bytes and why that many.
        self.kv_cache_plan = plan_kv_cache(self.ctx, self.model.num_layers, options,
                                           self.max_model_len, self.is_encoder)
        num_blocks = self.kv_cache_plan.num_blocks
        logger.info("KV cache: %s (%s); max_model_len %d: %s", self.kv_cache_plan.describe(),
                    config.kv_cache_dtype, self.max_model_len, why_length)
        generator = torch.Generator(self.ctx.device)
        if options.seed is None:
            generator.seed()
        else:
            generator.manual_seed(options.seed)
        events = KVEventBus()
        self.block_manager = BlockManager(num_blocks, config.block_size, events=events,
                                          enable_prefix_caching=options.enable_prefix_caching)
        speculator = build_speculator(options.speculative_config, ProposerTarget(
            options, self.ctx, int(self.hf_config.vocab_size), num_blocks, self.max_model_len))
        graph_limits = GraphLimits(options.max_num_seqs, self.max_model_len,
                                   options.max_num_batched_tokens,
                                   speculator.k + 1 if speculator else 1) if (
            options.step_graphs and self.parallelism.tensor_parallel_size == 1) else None
        self.runner = ModelRunner(self.parallelism.engine_model(self.model, self.ctx, num_blocks),
                                  self.ctx, num_blocks, generator, graph_limits,
                                  host_kv_caches=options.kv_connector is not None)
        scheduler = Scheduler(self.block_manager, max_num_seqs=options.max_num_seqs,
                              max_num_batched_tokens=options.max_num_batched_tokens,
                              max_model_len=self.max_model_len,
                              eos_token_ids=checkpoint.eos_token_ids)
        self.engine = LLMEngine(
            self.runner, scheduler, self.tokenizer, vocab_size=int(self.hf_config.vocab_size),
            root_hash=root_hash(model_key(self.hf_config.to_dict(), checkpoint.files,
                                          config.dtype)), speculator=speculator)
        self.connector: Connector | None = None
        if options.kv_connector is not None:
            self.connector = build_connector(
                options.kv_connector, engine_kv_layout(self.ctx, self.model),
                options.kv_load_failure_policy, dict(options.kv_connector_config or {}))
            closers.append(self.connector.close)
            scheduler.kv_transfer = KVTransfer(self.connector, self.block_manager, self.model,
                                               self.runner.kv_caches)
        #: Where KV events are published (``kv_events_endpoint`` resolved), or None.
        self.kv_events_endpoint: str | None = None
        if options.kv_events_endpoint is not None:
            publisher = ZmqEventPublisher(options.kv_events_endpoint)
            events.subscribe(publisher)
            closers.append(publisher.close)
            self.kv_events_endpoint = publisher.endpoint
        #: Everything this LLM runs with: the options and what the platform settled.
        self.config = ResolvedConfig(
            options=options, platform=platform.name, dtype=config.dtype,
            kv_cache_dtype=config.kv_cache_dtype, attention_backend=config.attention_backend,
            block_size=config.block_size, quant_method=self.ctx.quant_method.get_name(),
            weights=summarize(self.weights), max_model_len=self.max_model_len,
            num_kv_blocks=num_blocks,
            kv_cache=f"{self.kv_cache_plan.describe()}; max_model_len {self.max_model_len}: "
                     f"{why_length}",
            step_graphs=self._step_graphs_state(options, platform),
            speculative=speculator.describe() if speculator else "off")
        self._loop.engine = self.engine

    def _step_graphs_state(self, options: LLMConfig, platform: Platform) -> str:
        """Whether decode steps replay step graphs here, and why not."""
        if self.runner.graphs is not None:
            return f"on ({self.runner.graphs.recorder.name})"
        if not options.step_graphs:
            return "off"
        if self.parallelism.tensor_parallel_size > 1:
            return "off (tensor parallelism)"
        return f"off (platform {platform.name} replays no steps)"

    @property
    def kv_events(self) -> KVEventBus:
        """The prefix cache's KV events: ``llm.kv_events.subscribe(callback)`` gets each
        step's :class:`~hwplug.model_zoo.engine.kv_events.KVEventBatch`."""
        return self.block_manager.events

    def reset_prefix_cache(self) -> bool:
        """Drop every cached KV block (recording ``AllBlocksCleared``); False, doing
        nothing, while requests are running."""
        def reset() -> bool:
            done = self.block_manager.reset_prefix_cache()
            self.block_manager.events.flush()
            return done

        return bool(self._loop.call(reset))

    def close(self) -> None:
        """Stop the engine thread (requests still running fail) and close the connector and
        the event publisher; idempotent. Also done when the ``LLM`` is garbage-collected."""
        self._shutdown()

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

    def _require(self, encoder: bool, method: str) -> None:
        self.parallelism.check_serving(method)
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
        through. Raises :class:`ModelError` for anything else (ids are checked against the
        vocabulary when the request is made)."""
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        if isinstance(prompt, Seq) and all(is_integer(token) for token in prompt):
            return [int(token) for token in prompt]
        raise ModelError(f"a prompt must be a string or a list of integer token ids, got "
                         f"{describe(prompt)}")

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
        prompt, in order, each with ``sampling.n`` completions. ``sampling`` is shared, or
        one per prompt. Safe to call from several threads at once: the requests of every
        caller are batched together. Every prompt is checked before any runs."""
        self._require(encoder=False, method="generate()")
        if isinstance(prompts, str) or (isinstance(prompts, Seq) and prompts
                                        and isinstance(prompts[0], Integral)):
            prompts = [prompts]
        if not isinstance(prompts, Seq):
            raise ModelError(f"prompts must be a string, a list of token ids or a list of "
                             f"those, got {describe(prompts)}")
        token_ids = [self.tokenize(prompt) for prompt in prompts]
        if sampling is None or isinstance(sampling, SamplingParams):
            params = [sampling or SamplingParams()] * len(token_ids)
        else:
            params = list(sampling)
            if len(params) != len(token_ids) or not all(
                    isinstance(p, SamplingParams) for p in params):
                raise ConfigError(f"got {len(params)} sampling values for {len(token_ids)} "
                                  "prompts; pass one SamplingParams, or one per prompt")
        for ids, param in zip(token_ids, params, strict=True):
            self.engine.check_request(ids, param)
        return self.parallelism.generate(self._loop, prompts, token_ids, params)

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None) -> TextStream:
        """The completion of one prompt as a :class:`TextStream` of text pieces (one
        completion: ``sampling.n`` must be 1). The request starts now; several streams
        may be read at once, from any threads."""
        self._require(encoder=False, method="stream()")
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ConfigError(f"stream() yields one completion, got n={sampling.n}; use "
                              "generate() for several")
        text = prompt if isinstance(prompt, str) else None
        return TextStream(self._loop, self.submit(self.tokenize(prompt), sampling, text))

    def submit(self, prompt_ids: Seq[int], sampling: SamplingParams, prompt: str | None = None,
               listener: Callable[[], None] | None = None) -> RequestHandle:
        """Check and start one request; its handle gets each step's update (AsyncLLM's)."""
        self._require(encoder=False, method="submit()")
        return self._loop.submit(prompt_ids, sampling, prompt, listener)

    def warm_up(self) -> list[int]:
        """Record each decode batch bucket's (and its k-proposal verify step's) graph now, as
        ``hwplug serve`` does before it answers; the buckets recorded ([]: no step replays)."""
        self._require(encoder=False, method="warm_up()")
        return self._loop.call(self.engine.warm_up)

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
                                 f"but a text holds at most {self.max_model_len} (max_model_len)")
        pooled = self._loop.call(lambda: [  # on the engine's thread, one batch at a time
            self._embed_batch(encoded[start:end])
            for start, end in self._batches([len(e.input_ids) for e in encoded])])
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


def _close(loop: EngineLoop, closers: list[Callable[[], None]]) -> None:
    loop.shutdown()
    for close in closers:
        close()
