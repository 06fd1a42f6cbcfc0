"""Input generators of the multi-head latent attention ops: ``concat_and_cache_mla`` and
``mla_attention`` (see :mod:`hwplug.conformance.inputs` for the generator contract).

Latent caches of several ``kv_lora_rank`` / ``qk_rope_head_dim`` splits (so a kernel that
splits the entry in the wrong place reads a wrong key), in the query's dtype, another
float dtype or fp8 with a per-layer scale; batches of prefills, chunks after a context,
speculative verify steps and decodes in shuffled blocks (the paged-attention generator's
batches), so both the expanded and the absorbed forms are reached. Up-projections have rms
``kv_lora_rank ** -0.5``: keys, values and outputs of about unit rms.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from hwplug.conformance.case import Case, randn, seeded
from hwplug.conformance.paged_batches import (
    BlockLayout,
    PagedBatch,
    decode_step,
    mixed_step,
    verify_step,
)
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES, is_quantized_kv_cache


def _split(draw: st.DrawFn) -> tuple[int, int]:
    """``(kv_lora_rank, qk_rope_head_dim)``."""
    return draw(st.sampled_from((16, 24, 64))), draw(st.sampled_from((8, 16)))


def _kv_scale(draw: st.DrawFn, rng: torch.Generator, kv_dtype: str
              ) -> tuple[torch.Tensor | None, str]:
    if not is_quantized_kv_cache(kv_dtype):
        return None, ""
    scale = torch.rand((), generator=rng) * 0.1 + 0.01
    return scale, f" with kv_scale {float(scale):.3f}"


@st.composite
def concat_and_cache_mla(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]
                         ) -> Case:
    rng, (kv_lora, rope) = seeded(draw), _split(draw)
    num_tokens = draw(tokens)
    block_size = draw(st.sampled_from((1, 8, 16)))
    num_blocks = math.ceil(num_tokens / block_size) + draw(st.integers(0, 2))
    slots = torch.randperm(num_blocks * block_size, generator=rng)[:num_tokens]
    padded = draw(st.integers(0, num_tokens - 1))
    slots[torch.randperm(num_tokens, generator=rng)[:padded]] = -1
    kv_c, k_pe = randn(rng, (num_tokens, kv_lora), dtype), randn(rng, (num_tokens, rope), dtype)
    kv_dtype = draw(st.just(dtype) | st.sampled_from(FP8_KV_DTYPES))
    cache = randn(rng, (num_blocks, block_size, kv_lora + rope), kv_dtype)
    kv_scale, scale_label = _kv_scale(draw, rng, kv_dtype)
    return Case((kv_c, k_pe, cache, slots, kv_scale), {}, (dtype, kv_dtype),
                f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} {dtype} into {kv_dtype} "
                f"cache {tuple(cache.shape)}{scale_label}, {padded} padding slots",
                mutated=(2,))


@st.composite
def mla_attention(draw: st.DrawFn, dtype: str, tokens: st.SearchStrategy[int]) -> Case:
    """A mixed, a speculative verify or a decode-only batch (about a third each);
    ``tokens`` is unused (T is the sum of query lengths)."""
    rng, (kv_lora, rope) = seeded(draw), _split(draw)
    steps = draw(st.lists(mixed_step(), min_size=1, max_size=3)
                 | st.lists(verify_step(), min_size=1, max_size=4)
                 | st.lists(decode_step(), min_size=1, max_size=4))
    heads, nope, v_dim = (draw(st.sampled_from(s)) for s in ((1, 2, 4), (8, 16), (8, 12)))
    layout = BlockLayout.shuffled(rng, [s.context + s.new for s in steps],
                                  draw(st.sampled_from((8, 16))))
    batch = PagedBatch.build(layout, steps, pad=draw(st.sampled_from((0, -1))))
    num_tokens = int(batch.query_start_loc[-1])
    q_nope = randn(rng, (num_tokens, heads, nope), dtype)
    q_pe = randn(rng, (num_tokens, heads, rope), dtype)
    kv_dtype = draw(st.just(dtype) | st.sampled_from((*FLOAT_DTYPES, *FP8_KV_DTYPES)))
    cache = randn(rng, (layout.num_blocks, layout.block_size, kv_lora + rope), kv_dtype)
    kv_scale, scale_label = _kv_scale(draw, rng, kv_dtype)
    w_uk = randn(rng, (heads, nope, kv_lora), dtype, scale=kv_lora ** -0.5)
    w_uv = randn(rng, (heads, v_dim, kv_lora), dtype, scale=kv_lora ** -0.5)
    label = (f"q_nope {tuple(q_nope.shape)} q_pe {tuple(q_pe.shape)} {dtype}, latent cache "
             f"{kv_dtype} [.., {kv_lora} + {rope}]{scale_label}, w_uv {tuple(w_uv.shape)}, "
             f"block size {layout.block_size}, batch {batch.label}")
    args = (q_nope, q_pe, cache, batch.metadata(), w_uk, w_uv, (nope + rope) ** -0.5, kv_scale)
    # a variant and the reference read the same stored fp8 values: compute errors only
    judged = (dtype,) if is_quantized_kv_cache(kv_dtype) else (dtype, kv_dtype)
    return Case(args, {}, judged, label)
