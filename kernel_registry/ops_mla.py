"""The multi-head latent attention ops (DeepSeek-V2/V3): ``concat_and_cache_mla`` writes a
step's latents into the ``MLA`` cache, ``mla_attention`` attends over it (see
:mod:`hwplug.attention_mla` for the cache and the two forms, and
:mod:`hwplug.kernel_registry.reference.mla` for the references).

Tolerances: ``mla_attention`` chains the query's absorption (or the keys' expansion), the
attention and ``W_UV``, so a variant that keeps intermediates in the input dtype rounds
three times where ``paged_attention`` rounds once; its bf16 and fp16 terms are twice
``paged_attention``'s.
"""

from __future__ import annotations

from hwplug.kernel_registry.ops import _ELEMENTWISE, _FP8_STORED
from hwplug.kernel_registry.registry import kernels

__all__ = ["concat_and_cache_mla", "mla_attention"]

_REF = "hwplug.kernel_registry.reference.mla:"

concat_and_cache_mla = kernels.define_op(
    "concat_and_cache_mla", _REF + "concat_and_cache_mla",
    tolerances={**_ELEMENTWISE, **_FP8_STORED}, doc="""
concat_and_cache_mla(kv_c [T, L], k_pe [T, R], kv_cache [num_blocks, block_size, L + R],
                     slot_mapping [T] int64, kv_scale [] fp32 | None = None)
    In place: [kv_c[t], k_pe[t]] -> kv_cache[s // block_size, s % block_size] for
    s = slot_mapping[t] >= 0 (a negative slot is skipped), divided by kv_scale when given
    (fp8 caches, saturating) and cast to the cache dtype.
""")

mla_attention = kernels.define_op(
    "mla_attention", _REF + "mla_attention",
    tolerances={"float32": (2e-3, 2e-3), "float16": (4e-3, 4e-3), "bfloat16": (4e-2, 4e-2)},
    doc="""
mla_attention(q_nope [T, H, N], q_pe [T, H, R], kv_cache [num_blocks, block_size, L + R],
              metadata: AttentionMetadata, w_uk [H, N, L], w_uv [H, V, L], scale,
              kv_scale [] fp32 | None = None) -> [T, H, V] in q_nope.dtype
    Causal attention over each sequence's cached latents (read as stored.float() *
    kv_scale when given), batches as paged_attention's (metadata's block_tables, seq_lens,
    query_start_loc, max_query_len, max_seq_len). Head h's key of cached token s is
    [w_uk[h] @ c_s, k_pe_s] and its value w_uv[h] @ c_s (c_s, k_pe_s: the entry's first L
    and last R columns); its query [q_nope[t, h], q_pe[t, h]]; logits scale * q.k,
    softmax in fp32. A variant may compute it expanded (prefill) or absorbed (decode:
    q_nope @ w_uk against the latents as one KV head, w_uv after); the result is one.
""")
