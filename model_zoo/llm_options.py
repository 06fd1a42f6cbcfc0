"""Checking what a user hands :class:`~hwplug.model_zoo.llm.LLM` before anything loads."""

from __future__ import annotations

import logging
from numbers import Integral
from pathlib import Path
from typing import Any

from hwplug.errors import ConfigError
from hwplug.model_zoo.engine.scheduler import check_limits
from hwplug.model_zoo.loaders.resolve import checkpoint_format
from hwplug.model_zoo.sampling import MAX_SEED, is_integer

logger = logging.getLogger(__name__)


def check_options(*, max_num_seqs: Any, max_num_batched_tokens: Any, block_size: Any,
                  num_kv_blocks: Any, seed: Any, step_graphs: Any) -> None:
    """Raise :class:`ConfigError` for an ``LLM`` option of the wrong type or range."""
    check_limits(max_num_seqs, max_num_batched_tokens)
    if block_size is not None and (not is_integer(block_size) or block_size < 1):
        raise ConfigError(f"block_size must be None (the platform's choice) or an integer "
                          f">= 1, got {block_size!r}")
    if num_kv_blocks is not None and (isinstance(num_kv_blocks, bool)
                                      or not isinstance(num_kv_blocks, (Integral, float))):
        raise ConfigError(f"num_kv_blocks must be None, a block count or a fraction in "
                          f"(0, 1), got {num_kv_blocks!r}")
    if is_integer(num_kv_blocks) and num_kv_blocks < 1:
        raise ConfigError(f"num_kv_blocks must be >= 1 (a block count) or a fraction in "
                          f"(0, 1), got {num_kv_blocks}")
    if isinstance(num_kv_blocks, float) and not 0 < num_kv_blocks < 1:
        raise ConfigError(f"num_kv_blocks as a fraction of free memory must be in (0, 1), "
                          f"got {num_kv_blocks}")
    if not isinstance(step_graphs, bool):
        raise ConfigError(f"step_graphs must be True or False, got {describe(step_graphs)}")
    if seed is not None and (not is_integer(seed) or not 0 <= seed <= MAX_SEED):
        raise ConfigError(f"seed must be None or an integer in [0, 2**64), got {seed!r}")


def describe(value: Any) -> str:
    """``value``'s type and the start of its repr, for an error message."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def dequantize_needed(path: Path, dequantize: bool) -> bool:
    """Whether to load ``path`` dequantized: asked for, or a GGUF on a platform that runs no
    kernels on GGUF blocks (``gguf`` not among its quant methods; logged)."""
    from hwplug import current_platform

    if dequantize or checkpoint_format(path) != "gguf":
        return dequantize
    platform = current_platform()
    if "gguf" in platform.facts.supported_quant_methods:
        return False
    logger.info("loading %s dequantized: platform %s runs no kernels on GGUF blocks (its "
                "quant methods: %s)", path.name, platform.name,
                ", ".join(platform.facts.supported_quant_methods))
    return True
