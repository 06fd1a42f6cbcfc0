"""hwplug-cuda's Triton kernels against the reference ops of ``hwplug.kernel_registry``.

Every kernel is called with its op's signature and compared with
``hwplug.kernel_registry.reference`` within the op's stated tolerance
(``ops.<op>.tolerances``). Without a GPU the kernels run in the Triton interpreter on
small shapes (the interpreter truncates fp32 -> bf16 casts instead of rounding to
nearest: one bf16 ulp, inside the bf16 tolerance); on a GPU the shapes are larger.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from hwplug.errors import UnknownNameError, UnsupportedError
from hwplug.kernel_registry import ops, reference
from hwplug_cuda.kernels import activation, attention, cache, configs, norm, rotary
from hwplug_cuda.kernels.decode_attention import decode_attention, split_plan

ON_GPU = torch.cuda.is_available()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def assert_matches(op: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """``actual`` equals ``expected`` within the tolerance ``op`` states for its dtype."""
    atol, rtol = getattr(ops, op).tolerances[str(expected.dtype).removeprefix("torch.")]
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)


def random(*shape: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


# --- rms_norm ----------------------------------------------------------------------------

NORM_SHAPES = [(257, 4096), (3, 5000), (2, 16384)] if ON_GPU else [(3, 5, 96), (2, 1000)]


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", NORM_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(device: str, dtype: torch.dtype, shape: tuple[int, ...],
                  with_residual: bool) -> None:
    x = random(*shape, dtype=dtype, device=device)
    weight = random(shape[-1], dtype=dtype, device=device, seed=1)
    if not with_residual:
        assert_matches("rms_norm", norm.rms_norm(x, weight, 1e-6),
                       reference.rms_norm(x, weight, 1e-6))
        return
    residual = random(*shape, dtype=dtype, device=device, seed=2)
    out, summed = norm.rms_norm(x, weight, 1e-6, residual)
    expected_out, expected_summed = reference.rms_norm(x, weight, 1e-6, residual)
    assert_matches("rms_norm", summed, expected_summed)
    assert_matches("rms_norm", out, expected_out)


def test_rms_norm_rejects_too_wide_rows() -> None:
    wide = torch.empty(2, norm.MAX_HIDDEN + 1, device="meta")
    assert "hidden size" in norm.supported(wide, wide[0], 1e-6)
    with pytest.raises(UnsupportedError, match="hidden size"):
        norm.rms_norm(wide, wide[0], 1e-6)


# --- silu_and_mul / gelu_and_mul ---------------------------------------------------------

ACTIVATION_SHAPES = [(300, 2 * 11008), (5, 2 * 1000)] if ON_GPU else [(4, 3, 2 * 200),
                                                                        (2, 2 * 1500)]
GATED_OPS = {
    "silu": (activation.silu_and_mul, reference.silu_and_mul, {}),
    "gelu": (activation.gelu_and_mul, reference.gelu_and_mul, {}),
    "gelu_tanh": (activation.gelu_and_mul, reference.gelu_and_mul, {"approximate": "tanh"}),
}


@pytest.mark.parametrize("shape", ACTIVATION_SHAPES, ids=str)
@pytest.mark.parametrize("kind", GATED_OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gated_activation(device: str, dtype: torch.dtype, kind: str,
                          shape: tuple[int, ...]) -> None:
    kernel, oracle, kwargs = GATED_OPS[kind]
    x = 3 * random(*shape, dtype=dtype, device=device)
    op = "silu_and_mul" if kind == "silu" else "gelu_and_mul"
    assert_matches(op, kernel(x, **kwargs), oracle(x, **kwargs))


def test_gated_activation_rejects_bad_arguments() -> None:
    with pytest.raises(UnsupportedError, match="even last dimension"):
        activation.silu_and_mul(torch.empty(2, 5, device="meta"))
    with pytest.raises(UnsupportedError, match="approximate"):
        activation.gelu_and_mul(torch.empty(2, 4, device="meta"), approximate="fast")


# --- rotary_embedding --------------------------------------------------------------------

#: (tokens, query heads, key heads, head size); 40 query heads of size 64 take the kernel
#: two head tiles.
ROTARY_SHAPE = (300, 32, 8, 128) if ON_GPU else (7, 40, 8, 64)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("rotated", [1.0, 0.5], ids=["full", "partial"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rotary_embedding(device: str, dtype: torch.dtype, rotated: float,
                          is_neox: bool) -> None:
    num_tokens, num_heads, num_kv_heads, head_size = ROTARY_SHAPE
    rot_dim = int(head_size * rotated)
    # query and key as strided views of one fused QKV projection output
    qkv = random(num_tokens, num_heads + 2 * num_kv_heads, head_size, dtype=dtype,
                 device=device)
    query, key = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    cos_sin = reference.build_cos_sin_cache(rot_dim, 4096, 10000.0).to(device)
    positions = torch.randint(0, 4096, (num_tokens,), generator=torch.Generator().manual_seed(0))
    positions = positions.to(device)

    out = rotary.rotary_embedding(positions, query, key, cos_sin, is_neox)
    expected = reference.rotary_embedding(positions, query, key, cos_sin, is_neox)
    for actual, wanted, original in zip(out, expected, (query, key), strict=True):
        assert_matches("rotary_embedding", actual, wanted)
        assert torch.equal(actual[..., rot_dim:], original[..., rot_dim:])


# --- reshape_and_cache -------------------------------------------------------------------

CACHE_DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("kv_dtype", "cache_dtype"), CACHE_DTYPES, ids=str)
def test_reshape_and_cache(device: str, kv_dtype: torch.dtype, cache_dtype: torch.dtype,
                           block_size: int) -> None:
    num_tokens, num_blocks, num_kv_heads, head_size = (2000, 300, 8, 128) if ON_GPU else \
        (20, 6, 2, 40)
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::4] = -1  # padding tokens: skipped
    slots = slots.to(device)
    kv = random(num_tokens, 2, num_kv_heads, head_size, dtype=kv_dtype, device=device)
    key, value = kv[:, 0], kv[:, 1]  # strided views
    kv_cache = random(2, num_blocks, block_size, num_kv_heads, head_size, dtype=cache_dtype,
                      device=device, seed=1)
    expected = kv_cache.clone()

    cache.reshape_and_cache(key, value, kv_cache, slots)
    reference.reshape_and_cache(key, value, expected, slots)
    if cache_dtype.itemsize >= kv_dtype.itemsize:  # exact copies
        assert torch.equal(kv_cache, expected)
    else:
        assert_matches("reshape_and_cache", kv_cache, expected)


# --- paged_attention ---------------------------------------------------------------------


@dataclass
class PagedBatch:
    query: torch.Tensor
    kv_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.query, self.kv_cache, self.block_tables, self.seq_lens, \
            self.query_start_loc


def paged_batch(query_lens: list[int], seq_lens: list[int], heads: tuple[int, int, int],
                block_size: int, dtype: torch.dtype, device: str) -> PagedBatch:
    """Random queries and cache; each sequence's blocks are a shuffled subset of a larger
    cache, and table entries past its last block are -1."""
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
        random(2, num_blocks, block_size, num_kv_heads, head_size, dtype=dtype, device=device,
               seed=2),
        block_tables.to(device), torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc.to(device), max(query_lens), max(seq_lens))


#: name -> (query lengths, context lengths). "mixed" has decode rows, a prefill, an idle
#: sequence (no query) and a chunked prefill in one batch.
BATCHES = {
    "decode": ([1] * 6, [1, 17, 300, 1025, 2048, 4000]),
    "prefill": ([511, 1024], [511, 1024]),
    "chunked": ([128, 300], [2000, 700]),
    "mixed": ([1, 500, 0, 64, 1, 1], [2047, 500, 9, 1000, 1, 3000]),
} if ON_GPU else {
    "decode": ([1, 1, 1, 1], [1, 17, 40, 70]),
    "prefill": ([9, 33], [9, 33]),
    "chunked": ([8, 20], [30, 50]),
    "mixed": ([1, 12, 0, 5, 1], [23, 12, 7, 40, 1]),
}
#: (query heads, KV heads, head size): GQA, MQA, head sizes that are not powers of two.
HEADS = [(32, 8, 128), (16, 2, 64), (8, 1, 256), (12, 4, 96)] if ON_GPU else \
    [(4, 4, 32), (8, 2, 40)]


def check_attention(batch: PagedBatch, scale: float = 0.3, **kwargs: object) -> None:
    out = attention.paged_attention(*batch.args(), scale, **kwargs)
    assert_matches("paged_attention", out,
                   reference.paged_attention(*batch.args(), scale, **kwargs))


@pytest.mark.parametrize("heads", HEADS, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paged_attention(device: str, dtype: torch.dtype, kind: str, block_size: int,
                         heads: tuple[int, int, int]) -> None:
    batch = paged_batch(*BATCHES[kind], heads, block_size, dtype, device)
    check_attention(batch, max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len)


@pytest.mark.parametrize(("window", "soft_cap"), [(7, None), (None, 5.0), (7, 5.0)])
@pytest.mark.parametrize("kind", BATCHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_paged_attention_window_and_soft_cap(device: str, dtype: torch.dtype, kind: str,
                                             window: int | None,
                                             soft_cap: float | None) -> None:
    batch = paged_batch(*BATCHES[kind], HEADS[1], 16, dtype, device)
    check_attention(batch, sliding_window=window, soft_cap=soft_cap)


@pytest.mark.parametrize("kind", BATCHES)
def test_paged_attention_non_causal(device: str, kind: str) -> None:
    check_attention(paged_batch(*BATCHES[kind], HEADS[1], 32, torch.float32, device),
                    causal=False)


@pytest.mark.parametrize(("window", "soft_cap"), [(None, None), (20, None), (None, 5.0)])
def test_decode_split_kv(device: str, window: int | None, soft_cap: float | None) -> None:
    """A split size smaller than the contexts: partials per split, merged by the reduce
    kernel; with a window, the splits before it are empty."""
    batch = paged_batch(*BATCHES["decode"], HEADS[1], 16, torch.float32, device)
    config = configs.launch_config("paged_attention_decode", batch.query.device,
                                   batch.max_seq_len)
    split_size = 2 * config["block_n"]
    assert split_plan(1, batch.max_seq_len, config, batch.query.device, split_size)[1] > 1
    out = decode_attention(*batch.args(), 0.3, window, soft_cap, batch.max_seq_len, split_size)
    assert_matches("paged_attention", out,
                   reference.paged_attention(*batch.args(), 0.3, sliding_window=window,
                                             soft_cap=soft_cap))


def test_decode_splits_long_contexts_on_its_own(device: str) -> None:
    """Few (sequence, KV head) pairs over a long context: the tuned plan splits it."""
    seq_len, heads = (8000, HEADS[0]) if ON_GPU else (600, (2, 1, 32))
    batch = paged_batch([1], [seq_len], heads, 16, torch.bfloat16, device)
    config = configs.launch_config("paged_attention_decode", batch.query.device, seq_len)
    assert split_plan(heads[1], seq_len, config, batch.query.device)[1] > 1
    check_attention(batch)


def test_paged_attention_computes_missing_maxima(device: str) -> None:
    for kind in ("decode", "mixed"):
        check_attention(paged_batch(*BATCHES[kind], HEADS[1], 16, torch.float16, device))


@pytest.mark.parametrize(("change", "reason"), [
    ({"query": torch.empty(3, 8, 64, dtype=torch.float64)}, "dtype"),
    ({"query": torch.empty(3, 3, 64)}, "multiple of KV heads"),
    ({"query": torch.empty(3, 8, 512), "kv_cache": torch.empty(2, 4, 16, 2, 512)},
     "head size"),
    ({"causal": False, "sliding_window": 8}, "causal"),
    ({"soft_cap": 0.0}, "soft_cap"),
])
def test_paged_attention_rejects_what_it_cannot_serve(change: dict, reason: str) -> None:
    call = {"query": torch.empty(3, 8, 64), "kv_cache": torch.empty(2, 4, 16, 2, 64),
            "block_tables": torch.zeros(3, 2, dtype=torch.int32),
            "seq_lens": torch.ones(3, dtype=torch.int32),
            "query_start_loc": torch.arange(4, dtype=torch.int32), "scale": 1.0}
    call.update({name: value.to("meta") if isinstance(value, torch.Tensor) else value
                 for name, value in change.items()})
    assert reason in attention.supported(**call)
    with pytest.raises(UnsupportedError, match=reason):
        attention.paged_attention(**call)


# --- launch configs ----------------------------------------------------------------------


def test_every_kernel_has_a_complete_default_config() -> None:
    for kernel, keys in configs.CONFIG_KEYS.items():
        for size in (1, 128, 10**7):  # below, inside and beyond the buckets
            assert keys <= configs.launch_config(kernel, torch.device("cpu"), size).keys()


def test_unknown_kernel_config_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match="paged_attention_decode"):
        configs.launch_config("flash_mla", torch.device("cpu"), 1)
