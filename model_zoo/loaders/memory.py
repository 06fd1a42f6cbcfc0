"""How much memory a model and its KV cache take, checked before anything is allocated.

:func:`estimate_memory` builds the model on torch's ``meta`` device (shapes and dtypes, no
storage: milliseconds), so the weights' size is exact for any architecture and quant
method, and adds the KV cache of ``kv_tokens`` tokens in the backend's layout and the KV
dtype. :func:`check_memory` compares the estimate with the platform's free memory
(``platform.memory_info().free``) and raises a :class:`~hwplug.errors.ModelError` that says
how much is needed. :func:`~hwplug.model_zoo.context.build_model` calls both before it
allocates the model.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hwplug.dtypes import torch_dtype
from hwplug.errors import ModelError

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


def estimate_memory(model_cls: Any, hf_config: Any, ctx: ModelContext,
                    kv_tokens: int | None = None) -> MemoryEstimate:
    """The memory ``model_cls(hf_config, ctx)`` and its KV cache will take.

    ``kv_tokens`` defaults to ``hf_config.max_position_embeddings``: one full-length
    sequence, the least :class:`hwplug.LLM` allocates. Layers are counted as the model
    counts them (``num_layers``). Nothing is allocated.
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
    """Raise :class:`ModelError` when ``estimate`` exceeds ``platform``'s free memory,
    saying how much is needed and how much is free."""
    memory = platform.memory_info()
    logger.info("the model needs about %s; %s has %s free", estimate.describe(),
                platform.name, format_bytes(memory.free))
    if estimate.total > memory.free:
        raise ModelError(
            f"the model needs about {estimate.describe()}, but platform {platform.name} has "
            f"{format_bytes(memory.free)} free (of {format_bytes(memory.total)}): choose a "
            f"smaller dtype or model, or free memory")
