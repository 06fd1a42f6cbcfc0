"""Multi-head latent attention (issue 26): the ``MLA`` latent cache, the ``mla_attention``
reference in both its forms and the ``TORCH_MLA`` backend.

The two reference forms (expanded for prefill, absorbed for decode) are checked against a
per-sequence recomputation from fully expanded keys and values, over a mixed batch in
shuffled blocks.
"""

from __future__ import annotations

import pytest
import torch

from hwplug import registries
from hwplug.attention import AttentionMetadata, AttentionSpec
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference import mla
from hwplug.kv_cache_layout import MLA

HEADS, NOPE, ROPE, LORA, V = 4, 16, 8, 24, 12
BLOCK = 4


def _batch(rng: torch.Generator, steps: list[tuple[int, int]]):
    """A cache holding each sequence's ``context + new`` latents in shuffled blocks, and
    the metadata of a step computing the ``new`` last ones: ``(cache, metadata, entries)``
    with ``entries[i]`` sequence i's latents ``[S_i, L + R]``."""
    lens = [c + n for c, n in steps]
    counts = [-(-n // BLOCK) for n in lens]
    order = torch.randperm(sum(counts) + 2, generator=rng).tolist()
    tables, start = [], 0
    for count in counts:
        tables.append(order[start:start + count])
        start += count
    cache = torch.randn(sum(counts) + 2, BLOCK, LORA + ROPE, generator=rng)  # foreign data
    entries, slots = [], []
    for table, (context, new) in zip(tables, steps, strict=True):
        seq = torch.randn(context + new, LORA + ROPE, generator=rng)
        seq_slots = torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK
                                  for p in range(context + new)])
        mla.concat_and_cache_mla(seq[:, :LORA], seq[:, LORA:], cache, seq_slots)
        entries.append(seq)
        slots += seq_slots[context:].tolist()
    width = max(counts)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [-1] * (width - len(t)) for t in tables],
                                  dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0, *torch.tensor([n for _, n in steps]).cumsum(0)],
                                     dtype=torch.int32),
        max_query_len=max(n for _, n in steps), max_seq_len=max(lens))
    return cache, metadata, entries


def _recomputed(q_nope, q_pe, entries, steps, w_uk, w_uv, scale) -> torch.Tensor:
    """Per sequence and head: keys ``[W_UK c, k_pe]`` and values ``W_UV c`` of every cached
    token, causal softmax attention, written out with plain matmuls."""
    out, row = [], 0
    for seq, (context, new) in zip(entries, steps, strict=True):
        c, k_pe = seq[:, :LORA], seq[:, LORA:]
        for j in range(new):
            visible = context + j + 1
            heads = []
            for h in range(HEADS):
                keys = torch.cat([c[:visible] @ w_uk[h].T, k_pe[:visible]], -1)
                query = torch.cat([q_nope[row, h], q_pe[row, h]])
                weights = torch.softmax(keys @ query * scale, 0)
                heads.append(weights @ (c[:visible] @ w_uv[h].T))
            out.append(torch.stack(heads))
            row += 1
    return torch.stack(out)


@pytest.mark.parametrize("steps", [
    [(0, 7), (5, 3), (9, 1)],  # a prefill, a chunk after a context, a decode
    [(6, 1), (1, 1), (11, 1)],  # decode only
])
def test_both_forms_match_a_recomputation_from_expanded_keys_and_values(steps):
    rng = torch.Generator().manual_seed(len(steps) + steps[0][1])
    cache, metadata, entries = _batch(rng, steps)
    tokens = sum(n for _, n in steps)
    q_nope, q_pe = (torch.randn(tokens, HEADS, d, generator=rng) for d in (NOPE, ROPE))
    w_uk = torch.randn(HEADS, NOPE, LORA, generator=rng) * LORA ** -0.5
    w_uv = torch.randn(HEADS, V, LORA, generator=rng) * LORA ** -0.5
    scale = (NOPE + ROPE) ** -0.5
    want = _recomputed(q_nope, q_pe, entries, steps, w_uk, w_uv, scale)
    for form in (mla.mla_expanded, mla.mla_absorbed, mla.mla_attention):
        got = form(q_nope, q_pe, cache, metadata, w_uk, w_uv, scale)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_cache_write_fills_only_the_given_slots():
    cache = torch.zeros(3, BLOCK, LORA + ROPE)
    kv_c, k_pe = torch.randn(3, LORA), torch.randn(3, ROPE)
    mla.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([9, -1, 2]))
    want = torch.zeros_like(cache)
    want[2, 1] = torch.cat([kv_c[0], k_pe[0]])
    want[0, 2] = torch.cat([kv_c[2], k_pe[2]])
    assert torch.equal(cache, want)


def test_an_fp8_cache_write_divides_by_the_scale():
    cache = torch.zeros(1, BLOCK, LORA + ROPE, dtype=torch.float8_e4m3fn)
    kv_c, k_pe = torch.randn(1, LORA) * 100, torch.randn(1, ROPE) * 100
    scale = torch.tensor(0.5)
    mla.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([1]), scale)
    stored = cache[0, 1].float() * scale
    torch.testing.assert_close(stored, torch.cat([kv_c[0], k_pe[0]]).clamp(-224, 224),
                               atol=0, rtol=0.07)


def test_the_mla_layout_round_trips_through_nhd():
    cache = torch.randn(5, BLOCK, LORA + ROPE)
    assert MLA.shape(5, BLOCK, 1, LORA + ROPE) == tuple(cache.shape)
    reference = MLA.to_reference(cache)
    assert reference.shape == (2, 5, BLOCK, 1, LORA + ROPE) and not reference[1].any()
    out = torch.empty_like(cache)
    MLA.from_reference(reference, out)
    assert torch.equal(out, cache)
    with pytest.raises(UnsupportedError, match="one latent head"):
        MLA.shape(5, BLOCK, 2, LORA + ROPE)


def test_only_an_mla_backend_serves_an_mla_spec():
    paged, latent = (registries.attention_backends.get(n) for n in ("TORCH_PAGED", "TORCH_MLA"))
    spec = AttentionSpec(HEADS, 1, LORA + ROPE, is_mla=True)
    assert paged.validate(spec) == ["latent (MLA) attention needs an MLA backend"]
    assert latent.validate(spec) == []
    assert latent.validate(AttentionSpec(HEADS, HEADS, NOPE)) == [
        "an MLA backend serves only latent (MLA) attention"]
    backend = latent(spec)
    with pytest.raises(UnsupportedError, match="forward_mla"):
        backend.forward(None, None, None, None, None, 1.0)


def test_a_platform_that_lists_no_mla_backend_still_serves_latent_attention():
    from hwplug import current_platform
    from hwplug.attention_selection import select_backend

    cpu = current_platform()

    class PagedOnly(type(cpu)):
        attention_backend_priority = ("TORCH_PAGED",)

    platform = PagedOnly(cpu.sighting)
    assert platform.attention_backends()[-1] == "TORCH_MLA"
    spec = AttentionSpec(HEADS, 1, LORA + ROPE, is_mla=True)
    assert select_backend(platform, spec).backend.get_name() == "TORCH_MLA"
    assert select_backend(platform, AttentionSpec(HEADS, 2, 32)).backend.get_name() == (
        "TORCH_PAGED")
