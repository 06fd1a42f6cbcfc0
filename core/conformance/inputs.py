"""Hypothesis strategies of op inputs: one generator per op of :mod:`hwplug.kernel_registry.ops`.

A generator is ``generator(dtype, tokens) -> SearchStrategy[Case]``: ``dtype`` is the
hwplug dtype name of the op's dispatch tensor and ``tokens`` a strategy of that tensor's
leading dimension (num_tokens). Sizes stay small (the kit runs a few dozen examples per
variant) but cover what kernels get wrong: sizes that are not powers of two, extra leading
dimensions, partial rotary, GQA, padding slots, shuffled block tables, prefill, chunked
prefill and decode mixed in one batch, sliding windows and soft caps. Tensors are made on
CPU from a drawn seed, so every example is reproducible; :meth:`Case.to` moves one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from hypothesis import strategies as st

from hwplug import ops
from hwplug.attention import PagedAttentionParams
from hwplug.conformance.case import Case, Generator, leading_shape, randn, seeded
from hwplug.conformance.mla_inputs import concat_and_cache_mla, mla_attention
from hwplug.conformance.moe_inputs import (
    fp8_moe_experts,
    fused_moe,
    ggml_moe_experts,
    int8_moe_experts,
    moe_experts,
    moe_topk,
)
from hwplug.conformance.paged_batches import (  # noqa: F401  (importers of this module use them)
    BlockLayout,
    PagedBatch,
    Step,
    decode_step,
    mixed_step,
    verify_step,
)
from hwplug.conformance.quant_inputs import ggml, ggml_repacked, int4_linear, scaled_mm
from hwplug.conformance.sampling_inputs import rejection_sample
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES, is_quantized_kv_cache
from hwplug.errors import UnsupportedError
from hwplug.kv_cache_layout import NHD, KVCacheLayout

if TYPE_CHECKING:
    from hwplug.kernel_registry.dispatch import Op

__all__ = ["GENERATORS", "Case", "Generator"]


@st.composite
def rms_norm(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng = seeded(draw)
    shape = (*leading_shape(draw, tokens), draw(st.sampled_from((8, 48, 64, 96, 128, 200))))
    x = randn(rng, shape, dtype, scale=2.0)
    weight = randn(rng, shape[-1:], dtype, scale=0.2, shift=1.0)
    eps = draw(st.sampled_from((1e-6, 1e-5)))
    label = f"x {shape} {dtype} eps={eps:g}"
    if draw(st.booleans()):
        return Case((x, weight, eps), {"residual": randn(rng, shape, dtype)}, (dtype,),
                    label + " with residual")
    return Case((x, weight, eps), {}, (dtype,), label)


@st.composite
def rotary_embedding(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng = seeded(draw)
    num_tokens = draw(tokens)
    num_kv_heads, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    head_size = draw(st.sampled_from((32, 64, 80, 128)))
    rot_dim = draw(st.sampled_from((head_size, head_size // 2)))  # half = partial rotary
    is_neox = draw(st.booleans())
    max_position = draw(st.integers(1, 96))
    positions = torch.randint(0, max_position, (num_tokens,), generator=rng)
    cache = ops.build_cos_sin_cache(rot_dim, max_position, draw(st.sampled_from((1e4, 1e6))))
    query = randn(rng, (num_tokens, num_kv_heads * group, head_size), dtype)
    key = randn(rng, (num_tokens, num_kv_heads, head_size), dtype)
    style = "neox" if is_neox else "gptj"
    label = (f"query {tuple(query.shape)} key {tuple(key.shape)} {dtype} rot_dim={rot_dim} "
             f"{style}")
    return Case((positions, query, key, cache, is_neox), {}, (dtype,), label)


@st.composite
def silu_and_mul(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng = seeded(draw)
    shape = (*leading_shape(draw, tokens), 2 * draw(st.sampled_from((8, 24, 64, 100, 128))))
    return Case((randn(rng, shape, dtype, scale=3.0),), {}, (dtype,), f"x {shape} {dtype}")


@st.composite
def gelu_and_mul(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    case = draw(silu_and_mul(dtype, tokens))
    approximate = draw(st.sampled_from(("none", "tanh")))
    return replace(case, kwargs={"approximate": approximate},
                   label=f"{case.label} approximate={approximate}")


@st.composite
def reshape_and_cache(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng = seeded(draw)
    num_tokens = draw(tokens)
    num_kv_heads, head_size = draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((16, 64, 80)))
    block_size = draw(st.sampled_from((1, 8, 16, 32)))
    num_blocks = math.ceil(num_tokens / block_size) + draw(st.integers(0, 2))
    slots = torch.randperm(num_blocks * block_size, generator=rng)[:num_tokens]
    padded = draw(st.integers(0, num_tokens - 1))
    slots[torch.randperm(num_tokens, generator=rng)[:padded]] = -1
    key = randn(rng, (num_tokens, num_kv_heads, head_size), dtype)
    value = randn(rng, (num_tokens, num_kv_heads, head_size), dtype)
    kv_dtype = draw(st.just(dtype) | st.sampled_from(FP8_KV_DTYPES))  # usually the same
    kv_cache = randn(rng, (2, num_blocks, block_size, num_kv_heads, head_size), kv_dtype)
    scales, scales_label = _kv_scales(draw, rng, kv_dtype, num_kv_heads)
    label = (f"key/value {tuple(key.shape)} {dtype} into {kv_dtype} cache "
             f"{tuple(kv_cache.shape)}{scales_label}, {padded} padding slots")
    params = PagedAttentionParams(head_size ** -0.5, **scales)
    return Case((key, value, kv_cache, slots, params), {}, (dtype, kv_dtype), label,
                mutated=(2,))


def _kv_scales(draw: st.DrawFn, rng: torch.Generator, kv_dtype: str, num_kv_heads: int
               ) -> tuple[dict[str, torch.Tensor], str]:
    """``k_scale``/``v_scale`` for an fp8 cache (per tensor or per KV head), else none."""
    if not is_quantized_kv_cache(kv_dtype):
        return {}, ""
    per_head = draw(st.booleans())
    shape = (num_kv_heads,) if per_head else ()
    scales = {name: torch.rand(shape, generator=rng) * 0.1 + 0.01
              for name in ("k_scale", "v_scale")}
    return scales, f" with per-{'head' if per_head else 'tensor'} k/v scales"


@st.composite
def paged_attention(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """A mixed, a speculative verify or a decode-only batch (about a third each) over a
    random cache, its KV cache often in the query's dtype; ``tokens`` is unused (T is the
    sum of query lengths), so a variant limited by num_tokens declines the batches outside
    its range."""
    rng = seeded(draw)
    steps = draw(st.lists(mixed_step(), min_size=1, max_size=3)
                 | st.lists(verify_step(), min_size=1, max_size=4)
                 | st.lists(decode_step(), min_size=1, max_size=4))
    num_kv_heads, group = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2, 4)))
    head_size = draw(st.sampled_from((16, 32, 64, 80, 128)))
    layout = BlockLayout.shuffled(rng, [s.context + s.new for s in steps],
                                  draw(st.sampled_from((8, 16, 32))))
    batch = PagedBatch.build(layout, steps, pad=draw(st.sampled_from((0, -1))))
    causal = draw(st.booleans())
    window = draw(st.none() | st.integers(1, 24)) if causal else None
    soft_cap = draw(st.none() | st.sampled_from((5.0, 30.0)))
    query = randn(rng, (int(batch.query_start_loc[-1]), num_kv_heads * group, head_size), dtype)
    kv_dtype = draw(st.just(dtype) | st.sampled_from((*FLOAT_DTYPES, *FP8_KV_DTYPES)))
    kv_cache = randn(rng, (2, layout.num_blocks, layout.block_size, num_kv_heads, head_size),
                      kv_dtype)
    scales, scales_label = _kv_scales(draw, rng, kv_dtype, num_kv_heads)
    params = PagedAttentionParams(head_size ** -0.5, causal, window, soft_cap, **scales)
    label = (f"query {tuple(query.shape)} {dtype}, KV cache {kv_dtype}{scales_label}, KV heads "
             f"{num_kv_heads}, block size "
             f"{layout.block_size}, batch {batch.label}, causal={causal}, "
             f"sliding_window={window}, soft_cap={soft_cap}")
    args = (query, kv_cache, batch.metadata(), params)
    # a variant and the reference read the same stored fp8 values: compute errors only
    judged = (dtype,) if is_quantized_kv_cache(kv_dtype) else (dtype, kv_dtype)
    return Case(args, {}, judged, label)


@st.composite
def linear(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    rng = seeded(draw)
    leading = leading_shape(draw, tokens)
    k, n = draw(st.sampled_from((16, 40, 64))), draw(st.sampled_from((8, 24, 96)))
    x, weight = randn(rng, (*leading, k), dtype), randn(rng, (n, k), dtype, scale=k ** -0.5)
    bias = randn(rng, (n,), dtype) if draw(st.booleans()) else None
    label = f"x {(*leading, k)} weight ({n}, {k}) {dtype}, bias={bias is not None}"
    return Case((x, weight), {"bias": bias}, (dtype,), label)


#: The KV-cache argument of each op over a paged cache (its params argument is the op's
#: ``layout_arg``).
CACHE_ARGS = {"reshape_and_cache": 2, "paged_attention": 1}


def in_layout(case: Case, op: Op, layout: KVCacheLayout) -> Case:
    """``case`` of an op over a paged cache (made with an ``NHD`` cache) with the same
    entries in ``layout``: the cache converted with its ``from_reference`` and
    ``params.layout`` set, so the reference op's result is unchanged. Raises
    :class:`~hwplug.errors.UnsupportedError` when a cache of ``layout`` cannot hold these
    entries (its ``check`` says why, e.g. a head size it does not take)."""
    if layout is NHD:
        return case
    args = list(case.args)
    nhd = args[CACHE_ARGS[op.name]]
    _, num_blocks, block_size, num_kv_heads, head_size = nhd.shape
    cache = nhd.new_empty(layout.shape(num_blocks, block_size, num_kv_heads, head_size,
                                       nhd.dtype))
    problem = layout.check(cache)
    if problem:
        raise UnsupportedError(f"layout {layout.name} cannot hold this cache: {problem}")
    layout.from_reference(nhd, cache)
    args[CACHE_ARGS[op.name]] = cache
    args[op.layout_arg] = replace(args[op.layout_arg], layout=layout)
    return replace(case, args=tuple(args), label=f"{case.label}, layout {layout.name}")


@st.composite
def embedding(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """``dtype`` (int64, int32) ids into a random table of a float dtype."""
    rng = seeded(draw)
    rows, width = draw(st.integers(1, 40)), draw(st.sampled_from((8, 64, 576)))
    table_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    weight = randn(rng, (rows, width), table_dtype)
    ids = torch.randint(0, rows, (draw(tokens),), generator=rng).to(getattr(torch, dtype))
    return Case((ids, weight), {}, (dtype,),
                f"{dtype} ids {ids.tolist()} into a {table_dtype} table [{rows}, {width}]")


#: op name -> its input generator.
GENERATORS: dict[str, Generator] = {
    "rms_norm": rms_norm,
    "rotary_embedding": rotary_embedding,
    "silu_and_mul": silu_and_mul,
    "gelu_and_mul": gelu_and_mul,
    "reshape_and_cache": reshape_and_cache,
    "paged_attention": paged_attention,
    "linear": linear,
    "embedding": embedding,
    "scaled_mm": scaled_mm,
    "ggml_linear": ggml,
    "ggml_embedding": ggml,
    "ggml_repack": ggml_repacked,
    "ggml_linear_repacked": ggml_repacked,
    "ggml_embedding_repacked": ggml_repacked,
    "int4_linear": int4_linear,
    "moe_topk": moe_topk,
    "moe_experts": moe_experts,
    "fused_moe": fused_moe,
    "ggml_moe_experts": ggml_moe_experts,
    "fp8_moe_experts": fp8_moe_experts,
    "int8_moe_experts": int8_moe_experts,
    "rejection_sample": rejection_sample,
    "concat_and_cache_mla": concat_and_cache_mla,
    "mla_attention": mla_attention,
}
