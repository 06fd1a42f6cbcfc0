"""``paged_attention`` with Triton: a split-KV decode kernel and a paged flash-attention
prefill kernel behind the op's one signature.

Contract (the ``paged_attention`` op): ``query [T, Hq, D]`` over
``kv_cache [2, num_blocks, block_size, Hkv, D]`` (layout NHD) with ``block_tables [B, n]``,
``seq_lens [B]`` and ``query_start_loc [B + 1]``; sequence ``i``'s queries are the last
``q_len_i`` tokens of its ``seq_lens[i]``-token context. Key ``k`` is visible to the
query at position ``p`` iff ``(not causal or k <= p)`` and ``(sliding_window is None or
p - k < sliding_window)``; logits ``scale * q.k``, soft-capped if ``soft_cap``; softmax
in fp32; query head ``h`` reads KV head ``h // (Hq // Hkv)``. Returns a new contiguous
``[T, Hq, D]`` in ``query.dtype``. Block-table entries past a sequence's context are
never read (they may be negative); the table must be wide enough for every context.

Dispatch: every query length 1 -> :mod:`decode_attention` (GQA-grouped, split-KV);
otherwise :mod:`prefill_attention` serves the whole varlen batch, decode rows included.
``max_query_len`` / ``max_seq_len`` avoid a device->host sync where given: the decode
test needs ``max_query_len`` (only when ``T == B``) and the decode grid ``max_seq_len``;
the prefill grid needs neither.

supports: query and cache dtypes fp32 / bf16 / fp16, head size <= 256 (any, padded to a
power of two), any block size, ``Hq % Hkv == 0``; see :func:`supported`.
"""

from __future__ import annotations

import torch

from hwplug_cuda.kernels import MAX_HEAD_SIZE, checked
from hwplug_cuda.kernels.decode_attention import decode_attention
from hwplug_cuda.kernels.prefill_attention import prefill_attention

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def supported(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
              seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
              causal: bool = True, sliding_window: int | None = None,
              soft_cap: float | None = None, max_query_len: int | None = None,
              max_seq_len: int | None = None) -> str | None:
    """Why these kernels cannot serve the call, or None (no device sync)."""
    if query.dim() != 3 or kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        return f"expected query [T, Hq, D] and kv_cache [2, num_blocks, block_size, Hkv, D], " \
               f"got {tuple(query.shape)} and {tuple(kv_cache.shape)}"
    num_heads, head_size = query.shape[1:]
    num_kv_heads = kv_cache.shape[3]
    for name, tensor in (("query", query), ("kv_cache", kv_cache)):
        if tensor.dtype not in SUPPORTED_DTYPES:
            return f"{name} dtype {tensor.dtype} not in fp32, bf16, fp16"
        if tensor.stride(-1) != 1:
            return f"{name} needs a unit stride in its last dimension"
    if kv_cache.shape[4] != head_size or head_size > MAX_HEAD_SIZE:
        return f"head size {head_size} (cache {kv_cache.shape[4]}) must match and be " \
               f"<= {MAX_HEAD_SIZE}"
    if num_heads % num_kv_heads:
        return f"query heads {num_heads} not a multiple of KV heads {num_kv_heads}"
    if query_start_loc.shape != (seq_lens.shape[0] + 1,) or block_tables.shape[0] != \
            seq_lens.shape[0]:
        return f"query_start_loc {tuple(query_start_loc.shape)} must be [B + 1] and " \
               f"block_tables {tuple(block_tables.shape)} [B, n] for B = {seq_lens.shape[0]}"
    if sliding_window is not None and (not causal or sliding_window < 1):
        return f"sliding_window {sliding_window} needs causal=True and a value >= 1"
    if soft_cap is not None and soft_cap <= 0:
        return f"soft_cap must be > 0, got {soft_cap}"
    return None


@checked(supported)
def paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float,
                    causal: bool = True, sliding_window: int | None = None,
                    soft_cap: float | None = None, max_query_len: int | None = None,
                    max_seq_len: int | None = None) -> torch.Tensor:
    """The ``paged_attention`` op (see the module docstring)."""
    num_tokens, num_seqs = query.shape[0], seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return query.new_empty(query.shape)
    if num_tokens == num_seqs:
        if max_query_len is None:
            max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
        if max_query_len == 1:
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            return decode_attention(query, kv_cache, block_tables, seq_lens, query_start_loc,
                                    scale, sliding_window, soft_cap, max_seq_len)
    return prefill_attention(query, kv_cache, block_tables, seq_lens, query_start_loc, scale,
                             causal, sliding_window, soft_cap)
