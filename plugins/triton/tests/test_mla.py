"""hwplug-triton's multi-head latent attention kernels (``concat_and_cache_mla``,
``mla_attention``) against the reference ops within their stated tolerances.

Without a GPU the kernels run in the Triton interpreter on tiny shapes: several block
sizes (1, 4, 16), ragged contexts over shuffled blocks, decode-only batches (the absorbed
form the kernel is written for) and mixed prefill / chunk / decode batches, fp8 latent
caches with a scale. The reference computes decode-only batches in the absorbed form and
every other batch in the expanded one, so the mixed batches also check that the kernel's
absorbed prefill is the expanded result.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import (
    DTYPES,
    FP8_DTYPES,
    ON_GPU,
    assert_matches,
    fresh_registry,
    interpreter_only,
    random,
    skip_fp8_the_gpu_lacks,
)

from hwplug.attention import AttentionMetadata, AttentionSpec
from hwplug.conformance.variants import check_variant
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import reference
from hwplug.kernel_registry.reference.cache import quantize
from hwplug.kernel_registry.torch_mla import TorchMLABackend
from hwplug_triton.kernels import mla, mla_cache
from hwplug_triton.registration import MLA_OPS, register

HEADS, NOPE, ROPE, LORA, V = (16, 128, 64, 512, 128) if ON_GPU else (3, 16, 8, 24, 12)
#: (context already cached, new tokens) per sequence.
DECODE = [(6, 1), (0, 1), (13, 1)]
MIXED = [(0, 7), (5, 3), (9, 1)]


def _batch(steps: list[tuple[int, int]], block_size: int, cache_dtype: torch.dtype,
           device: str, kv_scale: torch.Tensor | None = None):
    """``(cache, metadata)``: each sequence's ``context + new`` latents (random, written by
    the reference) in shuffled blocks of a cache holding foreign data elsewhere, and the
    metadata of the step computing its ``new`` last tokens (table entries past a
    sequence's blocks are -1)."""
    gen = torch.Generator().manual_seed(block_size)
    lens = [c + n for c, n in steps]
    counts = [-(-n // block_size) for n in lens]
    order = torch.randperm(sum(counts) + 2, generator=gen).tolist()
    cache = quantize(torch.randn(sum(counts) + 2, block_size, LORA + ROPE, generator=gen)
                     .to(device), kv_scale, cache_dtype)
    tables, slots, used = [], [], 0
    for (context, new), count in zip(steps, counts, strict=True):
        table = order[used:used + count]
        used += count
        seq_slots = torch.tensor([table[p // block_size] * block_size + p % block_size
                                  for p in range(context + new)], device=device)
        latents = torch.randn(context + new, LORA + ROPE, generator=gen).to(device)
        reference.concat_and_cache_mla(latents[:, :LORA], latents[:, LORA:], cache, seq_slots,
                                       kv_scale)
        tables.append(table + [-1] * (max(counts) + 1 - count))
        slots += seq_slots[context:].tolist()
    query_lens = torch.tensor([n for _, n in steps])
    metadata = AttentionMetadata(
        torch.tensor(slots, device=device), torch.tensor(tables, dtype=torch.int32,
                                                         device=device),
        torch.tensor(lens, dtype=torch.int32, device=device),
        torch.tensor([0, *query_lens.cumsum(0).tolist()], dtype=torch.int32, device=device),
        int(query_lens.max()), max(lens))
    return cache, metadata


def _inputs(num_tokens: int, dtype: torch.dtype, device: str):
    """``q_nope``, ``q_pe``, ``w_uk``, ``w_uv`` in ``dtype``, scaled to unit-size logits."""
    return (random(num_tokens, HEADS, NOPE, dtype=dtype, device=device, seed=11),
            random(num_tokens, HEADS, ROPE, dtype=dtype, device=device, seed=12),
            (random(HEADS, NOPE, LORA, dtype=torch.float32, device=device, seed=13)
             * LORA ** -0.5).to(dtype),
            (random(HEADS, V, LORA, dtype=torch.float32, device=device, seed=14)
             * LORA ** -0.5).to(dtype))


def _check(steps, block_size, dtype, cache_dtype, device, kv_scale=None) -> torch.Tensor:
    cache, metadata = _batch(steps, block_size, cache_dtype, device, kv_scale)
    q_nope, q_pe, w_uk, w_uv = _inputs(metadata.slot_mapping.shape[0], dtype, device)
    scale = (NOPE + ROPE) ** -0.5
    got = mla.mla_attention(q_nope, q_pe, cache, metadata, w_uk, w_uv, scale, kv_scale)
    expected = reference.mla_attention(q_nope, q_pe, cache, metadata, w_uk, w_uv, scale,
                                       kv_scale)
    assert got.shape == expected.shape and got.dtype == dtype
    assert_matches("mla_attention", got, expected)
    return got


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("steps", [DECODE, MIXED], ids=["decode", "mixed"])
def test_mla_attention_matches_the_reference(device, block_size, steps):
    _check(steps, block_size, torch.float32, torch.float32, device)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn], ids=str)
def test_decode_split_over_the_context_matches_the_reference(device, cache_dtype):
    """Long contexts split into key ranges (flash-decoding) and merged: a sequence of 3
    splits, one of 2, one shorter than a split; an fp8 cache's scale applied in each."""
    kv_scale = torch.tensor(0.05, device=device) if cache_dtype.itemsize == 1 else None
    steps = [(69, 1), (40, 1), (5, 1)]
    cache, metadata = _batch(steps, 16, cache_dtype, device, kv_scale)
    q_nope, q_pe, w_uk, w_uv = _inputs(3, torch.float32, device)
    scale = (NOPE + ROPE) ** -0.5
    got = mla.absorbed_attention(q_nope, q_pe, cache, metadata, w_uk, w_uv, scale, kv_scale,
                                 split_size=32 if ON_GPU else 1)  # rounded up to key tiles
    assert_matches("mla_attention", got, reference.mla_attention(
        q_nope, q_pe, cache, metadata, w_uk, w_uv, scale, kv_scale))


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=str)
def test_mla_attention_in_half_precision_over_a_cache_of_its_dtype(device, dtype):
    _check(DECODE, 4, dtype, dtype, device)


@pytest.mark.parametrize("cache_dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("steps", [DECODE, MIXED], ids=["decode", "mixed"])
def test_mla_attention_over_an_fp8_latent_cache_with_its_scale(device, cache_dtype, steps):
    skip_fp8_the_gpu_lacks(cache_dtype)
    kv_scale = torch.tensor(0.05, device=device)
    got = _check(steps, 4, torch.float32, cache_dtype, device, kv_scale)
    # the scale is applied: reading the same bytes as if unscaled changes the result
    cache, metadata = _batch(steps, 4, cache_dtype, device, kv_scale)
    q_nope, q_pe, w_uk, w_uv = _inputs(metadata.slot_mapping.shape[0], torch.float32, device)
    unscaled = mla.mla_attention(q_nope, q_pe, cache, metadata, w_uk, w_uv,
                                 (NOPE + ROPE) ** -0.5)
    assert (unscaled - got).abs().max() > 0.05


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, *FP8_DTYPES], ids=str)
@pytest.mark.parametrize("block_size", [1, 16])
def test_concat_and_cache_mla_writes_what_the_reference_writes(device, cache_dtype,
                                                                block_size):
    skip_fp8_the_gpu_lacks(cache_dtype)
    gen = torch.Generator().manual_seed(5)
    num_tokens, num_blocks = 9, 12
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[::3] = -1  # padding: skipped
    slots = slots.to(device)
    model_dtype = torch.float32 if cache_dtype.itemsize == 1 else cache_dtype
    kv = random(num_tokens, LORA + 2 * ROPE, dtype=model_dtype, device=device, seed=6) * 4
    kv_c, k_pe = kv[:, :LORA], kv[:, LORA + ROPE:]  # strided views
    kv_scale = torch.tensor(0.5, device=device) if cache_dtype.itemsize == 1 else None
    start = random(num_blocks, block_size, LORA + ROPE, dtype=torch.float32, device=device,
                   seed=7).to(cache_dtype)
    written, expected = start.clone(), start.clone()
    mla_cache.concat_and_cache_mla(kv_c, k_pe, written, slots, kv_scale)
    reference.concat_and_cache_mla(kv_c, k_pe, expected, slots, kv_scale)
    assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
    assert not torch.equal(written.view(torch.uint8), start.view(torch.uint8))


def test_calls_the_kernels_cannot_serve_are_refused_with_the_reason(device):
    cache, metadata = _batch(DECODE, 4, torch.float32, device)
    q_nope, q_pe, w_uk, w_uv = _inputs(3, torch.float32, device)
    with pytest.raises(UnsupportedError, match=r"kv_cache must be \[num_blocks, block_size"):
        mla.mla_attention(q_nope, q_pe, cache[..., 1:], metadata, w_uk, w_uv, 0.1)
    assert "share one of fp32" in mla.supported(q_nope.half(), q_pe, cache, metadata, w_uk,
                                                w_uv, 0.1)
    assert "one element" in mla.supported(q_nope, q_pe, cache, metadata, w_uk, w_uv, 0.1,
                                          torch.ones(2, device=device))
    with pytest.raises(UnsupportedError, match="expected kv_c"):
        mla_cache.concat_and_cache_mla(q_nope[:, 0], q_pe, cache, metadata.slot_mapping)


class _Bound:
    """A kernel binder handing out the given implementation of each op."""

    def __init__(self, cache_write, attention) -> None:
        self.ops = {"concat_and_cache_mla": cache_write, "mla_attention": attention}

    def bind(self, op: str, dtype: str, layout: str | None = None):
        return self.ops[op]


def _step(tables: torch.Tensor, steps: list[tuple[int, int]], block_size: int,
          device: str) -> AttentionMetadata:
    """The metadata of a step computing ``new`` tokens after ``context`` per sequence,
    their slots in the sequences' blocks ``tables``."""
    slots = [int(tables[i, p // block_size]) * block_size + p % block_size
             for i, (context, new) in enumerate(steps) for p in range(context, context + new)]
    lens = [c + n for c, n in steps]
    query_lens = torch.tensor([n for _, n in steps])
    return AttentionMetadata(
        torch.tensor(slots, device=device), tables.to(device),
        torch.tensor(lens, dtype=torch.int32, device=device),
        torch.tensor([0, *query_lens.cumsum(0).tolist()], dtype=torch.int32, device=device),
        int(query_lens.max()), max(lens))


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn], ids=str)
def test_the_mla_backends_computation_on_these_kernels_over_prefill_then_decode(device,
                                                                               cache_dtype):
    """``TORCH_MLA``'s computation (what ``TRITON_MLA`` and its siblings run) with these
    kernels bound, over a prefill and two decode steps whose latents it writes itself,
    against the same backend on the references: the same outputs at every step and the
    same cache bytes."""
    block_size = 8  # one of TORCH_MLA's block sizes
    spec = AttentionSpec(HEADS, 1, LORA + ROPE, "float32", block_size=block_size,
                         kv_cache_dtype=None if cache_dtype == torch.float32 else "fp8_e4m3",
                         is_mla=True)
    backends = [TorchMLABackend(spec, _Bound(mla_cache.concat_and_cache_mla,
                                             mla.mla_attention)),
                TorchMLABackend(spec, _Bound(reference.concat_and_cache_mla,
                                             reference.mla_attention))]
    caches = [torch.zeros(8, block_size, LORA + ROPE, device=device).to(cache_dtype)
              for _ in backends]
    for backend in backends:
        backend.kv_scale = (torch.tensor(0.05, device=device) if cache_dtype.itemsize == 1
                            else None)
    tables = torch.tensor([[3, -1], [6, 1]], dtype=torch.int32)
    _, _, w_uk, w_uv = _inputs(1, torch.float32, device)
    for seed, steps in enumerate([[(0, 5), (0, 9)], [(5, 1), (9, 1)], [(6, 1), (10, 1)]]):
        metadata = _step(tables, steps, block_size, device)
        tokens = metadata.slot_mapping.shape[0]
        q_nope, q_pe = (random(tokens, HEADS, n, dtype=torch.float32, device=device,
                               seed=10 * seed + n) for n in (NOPE, ROPE))
        kv_c = random(tokens, LORA, dtype=torch.float32, device=device, seed=10 * seed + 1)
        k_pe = random(tokens, ROPE, dtype=torch.float32, device=device, seed=10 * seed + 2)
        got, expected = (backend.forward_mla(q_nope, q_pe, kv_c, k_pe, cache, metadata, w_uk,
                                             w_uv, (NOPE + ROPE) ** -0.5)
                         for backend, cache in zip(backends, caches, strict=True))
        assert_matches("mla_attention", got, expected)
        assert torch.equal(caches[0].view(torch.uint8), caches[1].view(torch.uint8))


def _reads_k_pe_first(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale, kv_scale=None):
    """The Triton kernel over a cache whose entries it reads as ``[k_pe, c]``: a wrong
    latent split."""
    rope = q_pe.shape[-1]
    swapped = torch.cat((kv_cache[..., -rope:], kv_cache[..., :-rope]), -1)
    return mla.mla_attention(q_nope, q_pe, swapped, metadata, w_uk, w_uv, scale, kv_scale)


@interpreter_only
def test_the_conformance_kit_passes_the_variants_as_a_plugin_registers_them() -> None:
    """The kit checks the variants ``hwplug_triton.register`` makes of the MLA ops on its
    own drawn inputs (simulated: the Triton interpreter); the Triton kernel reading the
    latent split wrongly fails the same check."""
    registry = fresh_registry()
    register(registry, platforms=(), ops=MLA_OPS)
    for op in MLA_OPS:
        (variant,) = [v for v in registry.variants(op) if v.name == "triton"]
        result = check_variant(variant, examples=8)
        assert (result.status, result.simulation) == ("simulated", "Triton interpreter"), result
    registry.register_variant("mla_attention", "wrong_split", _reads_k_pe_first,
                              dtypes=("float32",))
    (broken,) = [v for v in registry.variants("mla_attention") if v.name == "wrong_split"]
    result = check_variant(broken, examples=8)
    assert result.status == "failed" and "max abs error" in result.detail, result
