"""The AITER call behind the ``aiter`` variant of ``paged_attention``, checked against the
installed AITER when the variant loads.

The call is written for :data:`~hwplug_rocm_aiter.plugin.TESTED_AITER`'s ``aiter.paged_attention_rocm``, whose
leading parameters are :data:`PAGED_ATTENTION_ROCM` (passed positionally, as AITER's own
callers do). Importing this module imports ``aiter`` and compares the installed function's
parameters with them (:func:`signature_problem`): a release that renamed, reordered,
inserted or removed one, or added a parameter without a default, is refused with
:class:`~hwplug.errors.UnsupportedError` ("unsupported AITER version X, tested with Y")
instead of a call that would pass the wrong tensors. The registry loads a variant before
choosing it and turns that error into the variant's rejection reason, so
``triton_rocm_pa`` serves instead and ``hwplug kernels`` says why. Nothing here runs
without ``amd-aiter`` installed: the variant's package gate pins
:data:`~hwplug_rocm_aiter.plugin.AITER_REQUIREMENT`.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiter
import torch

from hwplug.errors import UnsupportedError
from hwplug_rocm_aiter.aiter_attention import PARTITION_SIZE
from hwplug_rocm_aiter.layout import key_view
from hwplug_rocm_aiter.plugin import AITER_REQUIREMENT, TESTED_AITER

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

logger = logging.getLogger(__name__)

#: ``aiter.paged_attention_rocm``'s leading parameters, in order, as the call passes them.
PAGED_ATTENTION_ROCM = (
    "out", "exp_sums", "max_logits", "tmp_out", "query", "key_cache", "value_cache",
    "num_kv_heads", "scale", "block_tables", "context_lens", "block_size",
    "max_context_len", "alibi_slopes", "kv_cache_dtype", "k_scale", "v_scale",
    "fp8_out_scale", "partition_size")


def installed_version(module: Any) -> str:
    """The installed AITER's version: its distribution's, else the module's ``__version__``."""
    try:
        return importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "unknown"))


def signature_problem(function: Callable[..., Any]) -> str | None:
    """How ``function``'s parameters differ from :data:`PAGED_ATTENTION_ROCM` (the leading
    ones in order; any further one must have a default), or None when the call fits."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError) as exc:  # a builtin without a signature
        return f"its signature cannot be read ({exc})"
    names = tuple(p.name for p in parameters[:len(PAGED_ATTENTION_ROCM)])
    if names != PAGED_ATTENTION_ROCM:
        first = next((i for i, (a, b) in enumerate(zip(names, PAGED_ATTENTION_ROCM,
                                                       strict=False)) if a != b),
                     min(len(names), len(PAGED_ATTENTION_ROCM)))
        got = names[first] if first < len(names) else "nothing"
        return (f"parameter {first + 1} is {got!r}, the call passes "
                f"{PAGED_ATTENTION_ROCM[first]!r} there")
    required = [p.name for p in parameters[len(PAGED_ATTENTION_ROCM):]
                if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        return f"it requires parameters the call does not pass: {', '.join(required)}"
    return None


def check_installed(module: Any) -> None:
    """Raise :class:`UnsupportedError` unless ``module`` (AITER) has the call's
    ``paged_attention_rocm``."""
    function = getattr(module, "paged_attention_rocm", None)
    problem = ("it has no paged_attention_rocm" if function is None
               else signature_problem(function))
    if problem:
        raise UnsupportedError(
            f"unsupported AITER version {installed_version(module)}, tested with "
            f"{TESTED_AITER}: aiter.paged_attention_rocm does not match the call "
            f"hwplug-rocm-aiter makes ({problem}); install amd-aiter{AITER_REQUIREMENT}")
    logger.debug("AITER %s: paged_attention_rocm matches the call", installed_version(module))


check_installed(aiter)


def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    params: PagedAttentionParams) -> torch.Tensor:
    """The ``paged_attention`` op over ``ROCM_PA`` for a decode batch that
    :func:`~hwplug_rocm_aiter.aiter_attention.supported` accepts: one query per sequence,
    so ``query [B, Hq, D]`` is AITER's ``[num_seqs, Hq, D]``; ``metadata.max_seq_len``
    sizes its partitions without a device sync."""
    num_seqs, num_heads, head_size = query.shape
    partitions = -(-metadata.max_seq_len // PARTITION_SIZE)
    out = torch.empty_like(query)
    exp_sums = torch.empty((num_seqs, num_heads, partitions), dtype=torch.float32,
                           device=query.device)
    max_logits = torch.empty_like(exp_sums)
    tmp_out = query.new_empty((num_seqs, num_heads, partitions, head_size))
    unit = torch.ones((), dtype=torch.float32, device=query.device)
    aiter.paged_attention_rocm(
        out, exp_sums, max_logits, tmp_out, query, key_view(kv_cache), kv_cache[1],
        kv_cache.shape[2], params.scale, metadata.block_tables, metadata.seq_lens,
        kv_cache.shape[-1], metadata.max_seq_len, None, "auto", unit, unit, None,
        PARTITION_SIZE)
    return out
