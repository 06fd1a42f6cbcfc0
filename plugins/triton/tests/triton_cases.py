"""Inputs and checks the kernel tests share: reproducible tensors, paged batches, the
attention and cache-write kernels of any KV-cache layout against the reference ops
within each op's stated tolerance, and a registry of their own to register the kernels
into. (hwplug-rocm-aiter's tests use them for the kernels of its own layout.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from hwplug.attention import AttentionMetadata, PagedAttentionParams
from hwplug.kernel_registry import KernelRegistry, kernels, reference
from hwplug.kv_cache_layout import NHD, KVCacheLayout
from hwplug_triton.registration import KERNEL_MODULES

ON_GPU = torch.cuda.is_available()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz]
#: AMD's fp8 formats (gfx942): NVIDIA GPUs have no MMA or conversion for them.
FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
ON_NVIDIA = ON_GPU and torch.version.hip is None
#: For a test that runs kernels on CPU tensors: only Triton's interpreter runs those (on an
#: NVIDIA H100 with triton 3.6 these failed as "cpu tensor?", not on their assertions).
interpreter_only = pytest.mark.skipif(ON_GPU, reason="runs kernels on CPU tensors, which "
                                      "only Triton's interpreter (no GPU) accepts")


def skip_fp8_the_gpu_lacks(dtype: torch.dtype) -> None:
    """Skip a test of fp8 format ``dtype`` on a GPU that has no instructions for it (fnuz
    on NVIDIA); the interpreter and AMD GPUs run every format."""
    if ON_NVIDIA and dtype in FNUZ:
        pytest.skip(f"{dtype} is AMD's fp8 format: NVIDIA GPUs have no instructions for it")


def assert_matches(op: str, actual: torch.Tensor, expected: torch.Tensor,
                   dtype: torch.dtype | None = None) -> None:
    """``actual`` equals ``expected`` within the tolerance ``op`` states for ``dtype``
    (default: ``expected``'s dtype)."""
    name = str(dtype or expected.dtype).removeprefix("torch.")
    atol, rtol = kernels.op(op).tolerances[name]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


def random(*shape: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def kv_scales(kv_dtype: torch.dtype, num_kv_heads: int, per_head: bool,
              device: str) -> dict[str, torch.Tensor]:
    """k/v scales for an fp8 cache (per KV head or per tensor), none for other caches, as
    keyword arguments of :class:`~hwplug.attention.PagedAttentionParams`."""
    if kv_dtype.itemsize != 1:
        return {}
    gen = torch.Generator().manual_seed(3)
    shape = (num_kv_heads,) if per_head else ()
    return {name: (torch.rand(shape, generator=gen) * 0.1 + 0.01).to(device)
            for name in ("k_scale", "v_scale")}


@dataclass
class PagedBatch:
    query: torch.Tensor
    kv_cache: torch.Tensor  # NHD
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int

    def metadata(self) -> AttentionMetadata:
        """The batch's attention metadata (no slots: the cache is written already)."""
        return AttentionMetadata(torch.zeros(0, dtype=torch.int64), self.block_tables,
                                 self.seq_lens, self.query_start_loc, self.max_query_len,
                                 self.max_seq_len)



def in_layout(nhd: torch.Tensor, layout: KVCacheLayout) -> torch.Tensor:
    """The ``NHD`` cache ``nhd``'s entries in a new cache of ``layout``."""
    _, num_blocks, block_size, num_kv_heads, head_size = nhd.shape
    cache = nhd.new_empty(layout.shape(num_blocks, block_size, num_kv_heads, head_size,
                                       nhd.dtype))
    layout.from_reference(nhd, cache)
    return cache


def check_attention(kernel: Callable[..., torch.Tensor], batch: PagedBatch,
                    layout: KVCacheLayout = NHD, scale: float = 0.3,
                    **options: object) -> None:
    """``kernel`` (a ``paged_attention`` entry point for ``layout``) on ``batch``, its cache
    converted to ``layout``, matches the reference on the NHD batch; ``options`` are
    further :class:`PagedAttentionParams` fields."""
    params = PagedAttentionParams(scale, **options)
    out = kernel(batch.query, in_layout(batch.kv_cache, layout), batch.metadata(),
                 PagedAttentionParams(scale, **options, layout=layout))
    assert_matches("paged_attention", out,
                   reference.paged_attention(batch.query, batch.kv_cache, batch.metadata(),
                                             params))


def write_both(kernel: Callable[..., None], layout: KVCacheLayout,
               shape: tuple[int, int, int, int], kv_dtype: torch.dtype,
               cache_dtype: torch.dtype, block_size: int, device: str,
               scales: dict[str, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache (in ``layout``) after ``kernel``'s write and after the reference's, from
    the same start: ``shape`` is (tokens, blocks, KV heads, head size); key/value are
    strided views and a quarter of the tokens padding (slot -1)."""
    num_tokens, num_blocks, num_kv_heads, head_size = shape
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1
    slots = slots.to(device)
    kv = random(num_tokens, 2, num_kv_heads, head_size, dtype=kv_dtype, device=device)
    key, value = kv[:, 0], kv[:, 1]
    start = in_layout(random(2, num_blocks, block_size, num_kv_heads, head_size,
                             dtype=cache_dtype, device=device, seed=1), layout)
    written, expected = start.clone(), start.clone()
    params = PagedAttentionParams(1.0, **(scales or {}), layout=layout)
    kernel(key, value, written, slots, params)
    reference.reshape_and_cache(key, value, expected, slots, params)
    return written, expected


def paged_batch(query_lens: list[int], seq_lens: list[int], heads: tuple[int, int, int],
                block_size: int, dtype: torch.dtype, device: str,
                kv_dtype: torch.dtype | None = None) -> PagedBatch:
    """Random queries and NHD cache; each sequence's blocks are a shuffled subset of a
    larger cache, and table entries past its last block are -1."""
    num_heads, num_kv_heads, head_size = heads
    gen = torch.Generator().manual_seed(0)
    blocks_needed = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_needed) + 4
    order = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.full((len(seq_lens), max(blocks_needed) + 1), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(blocks_needed):
        block_tables[i, :n] = order[used:used + n].int()
        used += n
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()],
                                   dtype=torch.int32)
    return PagedBatch(
        random(sum(query_lens), num_heads, head_size, dtype=dtype, device=device, seed=1),
        random(2, num_blocks, block_size, num_kv_heads, head_size, dtype=kv_dtype or dtype,
               device=device, seed=2),
        block_tables.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc.to(device), max(query_lens), max(seq_lens))


#: name -> (query lengths, context lengths). "mixed" has decode rows, a prefill, an idle
#: sequence (no query) and a chunked prefill in one batch.
BATCHES = {
    "decode": ([1] * 6, [1, 17, 300, 1025, 2048, 4000]),
    "prefill": ([511, 1024], [511, 1024]),
    "chunked": ([128, 300], [2000, 700]),
    "mixed": ([1, 500, 0, 64, 1, 1], [2047, 500, 9, 1000, 1, 3000]),
    "verify": ([5, 5, 1, 3, 5, 2], [6, 300, 1025, 2048, 4000, 17]),  # speculative: k + 1
} if ON_GPU else {
    "decode": ([1, 1, 1, 1], [1, 17, 40, 70]),
    "prefill": ([9, 70], [9, 70]),  # 70: query blocks past a whole 64-key tile
    "chunked": ([8, 20], [30, 90]),
    "mixed": ([1, 12, 0, 5, 1], [23, 12, 7, 40, 1]),
    "verify": ([5, 3, 1, 5], [9, 20, 40, 70]),  # a speculative verify step: k + 1 queries
}
#: (query heads, KV heads, head size): GQA, MQA, head sizes that are not powers of two.
HEADS = [(32, 8, 128), (16, 2, 64), (8, 1, 256), (12, 4, 96)] if ON_GPU else \
    [(4, 4, 32), (8, 2, 48)]


def fresh_registry() -> KernelRegistry:
    """A registry of its own declaring every op hwplug-triton serves (the process-wide one
    already holds the GPU plugins' registrations)."""
    registry = KernelRegistry()
    for op in KERNEL_MODULES:
        declared = kernels.op(op)
        registry.define_op(op, kernels.get(f"{op}/reference").impl, doc=declared.__doc__,
                           tolerances=declared.tolerances, dispatch_arg=declared.dispatch_arg,
                           layout_arg=declared.layout_arg)
    return registry
