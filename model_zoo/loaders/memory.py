"""How much memory a model and its KV cache take, checked before anything is allocated.

:func:`estimate_memory` builds the model on torch's ``meta`` device (shapes and dtypes, no
storage: milliseconds), so the weights' size is exact for any architecture and quant
method, and adds the KV cache of ``kv_tokens`` tokens (one sequence of ``max_model_len``,
see :func:`resolve_max_model_len`) in the backend's layout and the KV dtype.
:func:`check_memory` compares the estimate with the platform's free memory
(``platform.memory_info().free``) and raises a :class:`~hwplug.errors.ModelError` that says
how much is needed, or a :class:`~hwplug.errors.ConfigError` naming ``max_model_len`` when
the weights fit but that sequence's KV cache does not.
:func:`~hwplug.model_zoo.context.build_model` calls both before it allocates the model.
:func:`plan_kv_cache` then sizes the KV cache an ``LLM`` allocates, and says why.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hwplug.checks import is_integer
from hwplug.dtypes import torch_dtype
from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.llm_config import (
    DEFAULT_KV_CACHE_FRACTION,
    DEFAULT_MAX_MODEL_LEN,
    LLMConfig,
)

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)


def format_bytes(n: int) -> str:
    """``n`` bytes in GiB, MiB or KiB, whichever keeps the number at 1 or above."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n / 1024:.2f} KiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes the model's parameters and buffers (``weights``) and a KV cache of
    ``kv_tokens`` tokens (``kv_cache``) take, in the settled dtypes."""

    weights: int
    kv_cache: int
    kv_tokens: int
    dtype: str
    kv_cache_dtype: str

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def describe(self) -> str:
        """``"873.13 MiB (weights 515.13 MiB in float32 + KV cache of 8192 tokens in float32
        360.00 MiB)"``."""
        return (f"{format_bytes(self.total)} (weights {format_bytes(self.weights)} in "
                f"{self.dtype} + KV cache of {self.kv_tokens} tokens in {self.kv_cache_dtype} "
                f"{format_bytes(self.kv_cache)})")


def resolve_max_model_len(requested: int | None, context: int) -> tuple[int, str]:
    """``(tokens, why)``: the longest sequence (prompt and output) an ``LLM`` serves, for
    the ``max_model_len`` option ``requested`` and the model's context length ``context``
    (``max_position_embeddings``). None: the context, at most
    :data:`~hwplug.model_zoo.llm_config.DEFAULT_MAX_MODEL_LEN`. Raises
    :class:`ConfigError` for a ``requested`` length beyond the context."""
    if requested is None:
        if context <= DEFAULT_MAX_MODEL_LEN:
            return context, "the model's context length"
        return DEFAULT_MAX_MODEL_LEN, (f"the model's context length {context}, capped at "
                                       f"{DEFAULT_MAX_MODEL_LEN} (set max_model_len for more)")
    if requested > context:
        raise ConfigError(f"max_model_len must be an integer in [1, {context}] (the model's "
                          f"context length, max_position_embeddings), got {requested}")
    return requested, "as given"


def estimate_memory(model_cls: Any, hf_config: Any, ctx: ModelContext,
                    kv_tokens: int | None = None) -> MemoryEstimate:
    """The memory ``model_cls(hf_config, ctx)`` and its KV cache will take.

    ``kv_tokens`` defaults to ``hf_config.max_position_embeddings``: one sequence of the
    model's full context (:func:`~hwplug.model_zoo.context.build_model` passes the
    resolved ``max_model_len``, the least :class:`hwplug.LLM` allocates). Layers are
    counted as the model counts them (``num_layers``). Nothing is allocated.
    """
    with torch.device("meta"):
        skeleton = model_cls(hf_config, ctx)
    weights = sum(t.numel() * t.element_size()
                  for t in itertools.chain(skeleton.parameters(), skeleton.buffers()))
    tokens = int(hf_config.max_position_embeddings if kv_tokens is None else kv_tokens)
    engine = ctx.engine_config
    blocks = -(-tokens // engine.block_size)
    kv_cache = blocks * kv_cache_bytes_per_block(ctx, skeleton.num_layers)
    return MemoryEstimate(weights, kv_cache, tokens, engine.dtype, engine.kv_cache_dtype)


def kv_cache_bytes_per_block(ctx: ModelContext, num_layers: int) -> int:
    """Bytes one block takes across all layers' caches."""
    engine = ctx.engine_config
    shape = ctx.attention_backend.kv_cache_shape(1, engine.block_size, engine.num_kv_heads,
                                                 engine.head_size)
    element = torch.empty((), dtype=torch_dtype(engine.kv_cache_dtype)).element_size()
    return num_layers * element * int(torch.Size(shape).numel())


def check_memory(estimate: MemoryEstimate, platform: Platform) -> None:
    """Raise when ``estimate`` exceeds ``platform``'s free memory: a :class:`ConfigError`
    naming ``max_model_len`` and the longest that fits when the weights alone fit, else a
    :class:`ModelError`; both say how much is needed and how much is free."""
    memory = platform.memory_info()
    logger.info("the model needs about %s; %s has %s free", estimate.describe(),
                platform.name, format_bytes(memory.free))
    if estimate.total <= memory.free:
        return
    left = memory.free - estimate.weights
    if left > 0 and estimate.kv_cache:
        per_token = estimate.kv_cache / estimate.kv_tokens
        raise ConfigError(
            f"max_model_len={estimate.kv_tokens} needs a KV cache of "
            f"{format_bytes(estimate.kv_cache)} ({estimate.kv_cache_dtype}) for one "
            f"sequence, but platform {platform.name} has {format_bytes(left)} free after the "
            f"weights ({format_bytes(estimate.weights)}): choose max_model_len <= "
            f"{int(left // per_token)}, or a smaller kv_cache_dtype")
    raise ModelError(
        f"the model needs about {estimate.describe()}, but platform {platform.name} has "
        f"{format_bytes(memory.free)} free (of {format_bytes(memory.total)}): choose a "
        f"smaller dtype or model, or free memory")


@dataclass(frozen=True)
class KVCachePlan:
    """The KV cache an ``LLM`` allocates: ``num_blocks`` blocks of ``block_size`` tokens
    per layer, ``nbytes`` over every layer, for sequences of up to ``max_model_len``
    tokens, and ``reason``: why that many."""

    num_blocks: int
    block_size: int
    nbytes: int
    max_model_len: int
    reason: str

    def describe(self) -> str:
        """``"256 blocks of 16 tokens (4096 tokens, 224.00 MiB): max_num_seqs=1 ..."``."""
        return (f"{self.num_blocks} blocks of {self.block_size} tokens "
                f"({self.num_blocks * self.block_size} tokens, {format_bytes(self.nbytes)}): "
                f"{self.reason}")


def plan_kv_cache(ctx: ModelContext, num_layers: int, options: LLMConfig,
                  max_model_len: int, is_encoder: bool = False) -> KVCachePlan:
    """Size the KV cache for ``options`` (``num_kv_blocks``, ``max_num_seqs``,
    ``max_num_batched_tokens``) and sequences of up to ``max_model_len`` tokens.

    A ``num_kv_blocks`` count is taken as given. Otherwise a decoder gets what
    ``max_num_seqs`` sequences of ``max_model_len`` tokens can use, at most the
    ``num_kv_blocks`` fraction of the platform's free memory (default
    :data:`~hwplug.model_zoo.llm_config.DEFAULT_KV_CACHE_FRACTION`) and at least one such
    sequence (:func:`check_memory` has made sure one fits); an encoder gets one batch (its
    blocks are freed after it).
    """
    block_size = ctx.engine_config.block_size
    per_block = kv_cache_bytes_per_block(ctx, num_layers)
    requested = options.num_kv_blocks
    per_seq = -(-max_model_len // block_size)

    def plan(blocks: int, reason: str) -> KVCachePlan:
        return KVCachePlan(blocks, block_size, blocks * per_block, max_model_len, reason)

    if is_integer(requested):
        return plan(int(requested), f"num_kv_blocks={requested} as given")
    if is_encoder:  # one batch at a time, freed after it
        tokens = max(options.max_num_batched_tokens, max_model_len)
        return plan(-(-tokens // block_size) + options.max_num_seqs,
                    f"one batch of up to {tokens} tokens in up to "
                    f"max_num_seqs={options.max_num_seqs} texts")
    fraction = DEFAULT_KV_CACHE_FRACTION if requested is None else float(requested)
    free = ctx.platform.memory_info().free
    share = int(fraction * free) // per_block
    wanted = per_seq * options.max_num_seqs
    sequences = (f"max_num_seqs={options.max_num_seqs} sequences of max_model_len="
                 f"{max_model_len} tokens")
    free_text = f"{fraction:g} of the {format_bytes(free)} free"
    if wanted <= share:
        return plan(wanted, f"{sequences} (within {free_text})")
    if per_seq <= share:
        return plan(share, f"{free_text}: {share // per_seq} of the {sequences} at once")
    return plan(per_seq, f"one sequence of max_model_len={max_model_len} tokens (more than "
                         f"{free_text})")
