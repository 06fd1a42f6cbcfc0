"""The previous release's forms of the ops over a paged KV cache, kept working for a release.

Release 0.1 (until 2026-11-25) wrote the paged-attention arguments out one by one::

    reshape_and_cache(key, value, kv_cache, slot_mapping, k_scale=None, v_scale=None)
    paged_attention(query, kv_cache, block_tables, seq_lens, query_start_loc, scale,
                    causal=True, sliding_window=None, soft_cap=None, max_query_len=None,
                    max_seq_len=None, k_scale=None, v_scale=None)

The ops now take the step's :class:`~hwplug.attention.AttentionMetadata` and the layer's
:class:`~hwplug.attention.PagedAttentionParams` (see :mod:`hwplug.kernel_registry.ops`).
Both directions are bridged, each with one :class:`DeprecationWarning` per op and side:

- :func:`current_form`: a call in the old form (a plugin's backend calling ``ops.*`` as the
  guide of the time showed) becomes the new one, the cache in the reference ``NHD`` layout;
- :func:`adapt_variant`: a variant implemented with the old signature (its parameters
  name ``slot_mapping`` / ``block_tables`` and no ``params``) is wrapped to take the new
  form (it serves the ``NHD`` layout, which was the only one).

Remove this module, and its two callers, in the release after next.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from hwplug.attention import AttentionMetadata, PagedAttentionParams

#: Where each op's new form takes the params (positional index).
PARAMS_AT = {"reshape_and_cache": 4, "paged_attention": 3}
_OLD_PAGED = ("block_tables", "seq_lens", "query_start_loc", "scale", "causal",
              "sliding_window", "soft_cap", "max_query_len", "max_seq_len", "k_scale",
              "v_scale")
_warned: set[tuple[str, str]] = set()


def _warn_once(op: str, side: str, message: str) -> None:
    if (op, side) not in _warned:
        _warned.add((op, side))
        warnings.warn(message, DeprecationWarning, stacklevel=4)


def _is_new_form(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    at = PARAMS_AT[op]
    if "params" in kwargs or (len(args) > at and isinstance(args[at], PagedAttentionParams)):
        return True
    return op == "paged_attention" and (
        "metadata" in kwargs or (len(args) > 2 and isinstance(args[2], AttentionMetadata)))


def current_form(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a call of ``op`` in the current form (unchanged when it is
    already in it; ``op`` not one of :data:`PARAMS_AT`: unchanged)."""
    if op not in PARAMS_AT or _is_new_form(op, args, kwargs):
        return args, kwargs
    _warn_once(op, "call", f"{op} called with the arguments written out (release 0.1's "
               f"form) is deprecated; pass AttentionMetadata and PagedAttentionParams "
               f"(see hwplug.ops.{op}.__doc__)")
    if op == "reshape_and_cache":
        key, value, kv_cache, slot_mapping, *scales = args
        k_scale, v_scale = (list(scales) + [None, None])[:2]
        params = PagedAttentionParams(1.0, k_scale=kwargs.get("k_scale", k_scale),
                                      v_scale=kwargs.get("v_scale", v_scale))
        return (key, value, kv_cache, slot_mapping, params), {}
    import torch  # here, not at module level: registering the ops must not load torch

    query, kv_cache, *rest = args
    named = dict(zip(_OLD_PAGED, rest, strict=False)) | kwargs
    seq_lens, query_start_loc = named["seq_lens"], named["query_start_loc"]
    max_query_len = named.get("max_query_len")
    max_seq_len = named.get("max_seq_len")
    metadata = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64, device=query.device),
        block_tables=named["block_tables"], seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        max_query_len=int(max_query_len if max_query_len is not None
                          else (query_start_loc[1:] - query_start_loc[:-1]).max()),
        max_seq_len=int(max_seq_len if max_seq_len is not None else seq_lens.max()))
    params = PagedAttentionParams(
        named["scale"], named.get("causal", True), named.get("sliding_window"),
        named.get("soft_cap"), named.get("k_scale"), named.get("v_scale"))
    return (query, kv_cache, metadata, params), {}


def adapt_variant(op: str, impl: Callable[..., Any]) -> Callable[..., Any]:
    """``impl`` itself, or, when it has release 0.1's signature of ``op`` (see the module
    docstring), a wrapper that takes the current form and calls it the old way."""
    if op not in PARAMS_AT or not callable(impl):
        return impl
    try:
        names = list(inspect.signature(impl).parameters)
    except (TypeError, ValueError):  # a builtin or C function: nothing to read
        return impl
    old = "params" not in names and (
        "block_tables" in names if op == "paged_attention" else "slot_mapping" in names)
    if not old:
        return impl
    _warn_once(op, "variant", f"a {op} variant with release 0.1's signature "
               f"({getattr(impl, '__qualname__', impl)!r}) is deprecated; take "
               f"AttentionMetadata and PagedAttentionParams (see hwplug.ops.{op}.__doc__)")

    if op == "reshape_and_cache":
        @functools.wraps(impl)
        def reshape_and_cache(key: Any, value: Any, kv_cache: Any, slot_mapping: Any,
                              params: PagedAttentionParams) -> Any:
            return impl(key, value, kv_cache, slot_mapping, params.k_scale, params.v_scale)
        return reshape_and_cache

    @functools.wraps(impl)
    def paged_attention(query: Any, kv_cache: Any, metadata: AttentionMetadata,
                        params: PagedAttentionParams) -> Any:
        return impl(query, kv_cache, metadata.block_tables, metadata.seq_lens,
                    metadata.query_start_loc, params.scale, params.causal,
                    params.sliding_window, params.soft_cap, metadata.max_query_len,
                    metadata.max_seq_len, params.k_scale, params.v_scale)
    return paged_attention
