"""``JAX_MLA``, the tpu platform's latent attention backend, and its JAX variants: chosen
for MLA specs (an fp8 latent cache goes to ``TORCH_MLA``), the cache written as the
reference writes it, prefill (expanded form) and decode (absorbed form) against the
references, and decode recorded into a compiled step over the resident cache.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import torch

from hwplug.attention import AttentionMetadata, AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.kernel_registry.reference import mla as reference
from hwplug_tpu import variants_mla
from hwplug_tpu.attention import JaxMlaBackend
from hwplug_tpu.bridge import device, place, resident, to_torch
from hwplug_tpu.step import JaxStepRecorder

H, N, R, V, L, BLOCK = 4, 16, 8, 12, 24, 8
SPEC = AttentionSpec(num_heads=H, num_kv_heads=1, head_size=L + R, dtype="float32",
                     kv_cache_dtype="float32", block_size=BLOCK, is_mla=True)
SCALE = (N + R) ** -0.5
#: Two sequences: blocks [1, 3] and [2]; prompts of 11 and 5 tokens.
TABLES = torch.tensor([[1, 3], [2, 0]], dtype=torch.int32)
PROMPTS = (11, 5)


def _slots(seq: int, positions: range) -> list[int]:
    return [int(TABLES[seq, p // BLOCK]) * BLOCK + p % BLOCK for p in positions]


def _metadata(lengths: tuple[int, int], new: tuple[int, int]) -> AttentionMetadata:
    """Both sequences at ``lengths`` cached tokens, the last ``new`` of each this step's."""
    slots = [s for i in (0, 1) for s in _slots(i, range(lengths[i] - new[i], lengths[i]))]
    starts = torch.tensor([0, new[0], new[0] + new[1]], dtype=torch.int32)
    return AttentionMetadata(torch.tensor(slots), TABLES, torch.tensor(lengths, dtype=torch.int32),
                             starts, max(new), max(lengths))


def _step(g: torch.Generator, tokens: int) -> tuple[torch.Tensor, ...]:
    """q_nope, q_pe, kv_c, k_pe of ``tokens`` tokens."""
    return (torch.randn(tokens, H, N, generator=g), torch.randn(tokens, H, R, generator=g),
            torch.randn(tokens, L, generator=g), torch.randn(tokens, R, generator=g))


def _weights(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(H, N, L, generator=g) * L ** -0.5, torch.randn(H, V, L, generator=g) * L ** -0.5


def test_the_platform_chooses_jax_mla_for_latent_attention(stand_in):
    assert JaxMlaBackend.is_mla and JaxMlaBackend.kv_cache_layout == "MLA"
    assert select_backend(stand_in, SPEC).backend is JaxMlaBackend
    fp8 = select_backend(stand_in, replace(SPEC, kv_cache_dtype="fp8_e4m3"))
    assert fp8.backend.get_name() == "TORCH_MLA"
    assert select_backend(stand_in, replace(SPEC, is_mla=False, num_kv_heads=2,
                                            head_size=32)).backend.get_name() == "PALLAS_RPA"


def test_prefill_then_decode_match_the_references(stand_in):
    """Prefill runs the expanded form, decode the absorbed one; each equals the reference
    of that form, and the cache holds what the reference writes."""
    g = torch.Generator().manual_seed(0)
    w_uk, w_uv = _weights(g)
    backend = JaxMlaBackend(SPEC)
    cache = torch.zeros(JaxMlaBackend.kv_cache_shape(4, BLOCK, 1, L + R))
    ref_cache = cache.clone()
    for lengths, new, form in ((PROMPTS, PROMPTS, reference.mla_expanded),
                               ((12, 6), (1, 1), reference.mla_absorbed)):
        metadata = _metadata(lengths, new)
        q_nope, q_pe, kv_c, k_pe = _step(g, sum(new))
        got = backend.forward_mla(q_nope, q_pe, kv_c, k_pe, cache, metadata, w_uk, w_uv, SCALE)
        reference.concat_and_cache_mla(kv_c, k_pe, ref_cache, metadata.slot_mapping)
        want = form(q_nope, q_pe, ref_cache, metadata, w_uk, w_uv, SCALE)
        assert torch.equal(cache, ref_cache)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        assert got.shape == (sum(new), H, V)


def test_a_recorded_decode_step_writes_the_resident_cache(stand_in):
    """Decode recorded and compiled: the latents land in the device copy of the cache and
    the output is the op-by-op one, replay after replay."""
    g = torch.Generator().manual_seed(1)
    w_uk, w_uv = _weights(g)
    for weight in (w_uk, w_uv):
        place(weight, device())
    cache = torch.zeros(4, BLOCK, L + R)
    ref_cache = cache.clone()
    prompt = _step(g, sum(PROMPTS))
    variants_mla.concat_and_cache_mla(*prompt[2:], ref_cache, _metadata(PROMPTS, PROMPTS).slot_mapping)
    cache.copy_(ref_cache)
    place(cache, device(), mutable=True)
    inputs = [torch.zeros(2, H, N), torch.zeros(2, H, R), torch.zeros(2, L), torch.zeros(2, R)]
    metadata = _metadata((12, 6), (1, 1))

    def step() -> torch.Tensor:
        variants_mla.concat_and_cache_mla(inputs[2], inputs[3], cache, metadata.slot_mapping)
        return variants_mla.mla_attention(inputs[0], inputs[1], cache, metadata, w_uk, w_uv,
                                          SCALE)

    recorder = JaxStepRecorder()
    with recorder.record() as graph:
        graph.outputs = step()
    for _ in range(2):
        for tensor, value in zip(inputs, _step(g, 2), strict=True):
            tensor.copy_(value)
        with jax.transfer_guard("disallow_explicit"):
            got = graph.replay().clone()
        reference.concat_and_cache_mla(inputs[2], inputs[3], ref_cache, metadata.slot_mapping)
        want = reference.mla_absorbed(*inputs[:2], ref_cache, metadata, w_uk, w_uv, SCALE)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(to_torch(resident(cache)), ref_cache)
    assert len(recorder.compiled) == 1
