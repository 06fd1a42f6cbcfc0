"""The conformance kit on the multi-head latent attention ops and backends: every
registered ``concat_and_cache_mla`` / ``mla_attention`` variant is checked against the
reference, and deliberately broken ones, registered here, fail: a wrong latent split, a
query without its rotary part, a missing causal mask, a wrong cache slot. ``TORCH_MLA``
passes the kit's backend checks, and ``hwplug kernels`` lists the MLA ops."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hwplug import current_platform, kernels, registries
from hwplug.conformance import check_variant
from hwplug.conformance.backends import check_backend
from hwplug.kernel_registry.reference import mla

OPS = ("concat_and_cache_mla", "mla_attention")


@pytest.fixture
def private_variants(fresh_discovery):
    """Register variants under a private source; drop them afterwards."""
    from hwplug.registry import current_source

    current_platform()
    token = current_source.set("test_conformance_mla")
    yield kernels
    current_source.reset(token)
    kernels.drop_source("test_conformance_mla")


def _wrong_latent_split(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale, kv_scale=None):
    """Reads k_pe from the entry's first columns and the latent after them."""
    rope = q_pe.shape[-1]
    swapped = torch.cat([kv_cache[..., -rope:], kv_cache[..., :-rope]], -1)
    return mla.mla_attention(q_nope, q_pe, swapped, metadata, w_uk, w_uv, scale, kv_scale)


def _ignores_rope(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale, kv_scale=None):
    return mla.mla_attention(q_nope, torch.zeros_like(q_pe), kv_cache, metadata, w_uk, w_uv,
                             scale, kv_scale)


def _sees_the_whole_context(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale,
                            kv_scale=None):
    """Every query of a sequence attends to all of its context (no causal mask)."""
    qsl = metadata.query_start_loc.long()
    query_lens = qsl[1:] - qsl[:-1]
    seqs = torch.repeat_interleave(torch.arange(len(query_lens)), query_lens)
    rows = replace(metadata, block_tables=metadata.block_tables[seqs],
                   seq_lens=metadata.seq_lens[seqs],
                   query_start_loc=torch.arange(len(seqs) + 1, dtype=torch.int32),
                   max_query_len=1)
    return mla.mla_absorbed(q_nope, q_pe, kv_cache, rows, w_uk, w_uv, scale, kv_scale)


def _shifted_slot(kv_c, k_pe, kv_cache, slot_mapping, kv_scale=None):
    slots = kv_cache.shape[0] * kv_cache.shape[1]
    shifted = torch.where(slot_mapping >= 0, (slot_mapping + 1) % slots, slot_mapping)
    mla.concat_and_cache_mla(kv_c, k_pe, kv_cache, shifted, kv_scale)


BROKEN = {
    ("mla_attention", "wrong_latent_split"): _wrong_latent_split,
    ("mla_attention", "ignores_rope"): _ignores_rope,
    ("mla_attention", "sees_the_whole_context"): _sees_the_whole_context,
    ("concat_and_cache_mla", "shifted_slot"): _shifted_slot,
}


@pytest.mark.parametrize("op, name", sorted(BROKEN))
def test_a_broken_mla_variant_fails(op, name, private_variants):
    private_variants.register_variant(op, name, BROKEN[(op, name)], dtypes=("float32",))
    result = check_variant(f"{op}/{name}", examples=30)
    assert result.status == "failed" and "max abs error" in result.detail, result


def test_the_cpu_variants_of_the_mla_ops_pass(private_variants):
    variants = [v for op in OPS for v in kernels.variants(op) if v.name != kernels.REFERENCE
                and v.requirements.platforms in (None, (), ("cpu",))]
    assert [v.key for v in variants] == ["mla_attention/absorbed"]
    for variant in variants:
        result = check_variant(variant, examples=15)
        assert result.status == "passed", result


def test_the_torch_mla_backend_passes_the_backend_checks(fresh_discovery):
    results = {r.check.split(": ")[1]: r for r in check_backend(
        registries.attention_backends.get("TORCH_MLA"), examples_per_scenario=2)}
    for scenario in ("prefill", "chunked prefill", "decode", "speculative verify",
                     "mixed batch", "validate refuses unclaimed features"):
        assert results[scenario].status == "passed", results[scenario]
    assert "non-MLA" in results["validate refuses unclaimed features"].detail
    assert results["sliding window"].status == "skipped"


def test_an_mla_backend_that_stores_the_latent_split_wrongly_fails(fresh_discovery):
    torch_mla = registries.attention_backends.get("TORCH_MLA")

    class RopeFirst(torch_mla):
        """Stores [k_pe, kv_c] and reads it back the same way: its outputs are right,
        its cache is not what the MLA layout says (connectors would move wrong bytes)."""

        @classmethod
        def get_name(cls) -> str:
            return "TEST_ROPE_FIRST"

        def forward_mla(self, q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, w_uk, w_uv, scale):
            rope = k_pe.shape[-1]
            out = super().forward_mla(q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, w_uk, w_uv,
                                      scale)
            kv_cache.copy_(torch.cat([kv_cache[..., -rope:], kv_cache[..., :-rope]], -1))
            return out

    (decode, *_) = check_backend(RopeFirst, examples_per_scenario=2)[2:3]
    assert decode.status == "failed" and "its cache" in decode.detail, decode


def test_hwplug_kernels_lists_the_mla_ops_and_backend():
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hwplug", "kernels", "--json", "--op",
                          "mla_attention", "--op", "concat_and_cache_mla", "--dtype", "float32"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    attention = report["ops"]["mla_attention"]["float32"]
    assert attention["chosen"] == "absorbed" and attention["fallbacks"] == ["reference"]
    assert attention["num_tokens"] == {"absorbed": [1, 17]}
    assert report["ops"]["concat_and_cache_mla"]["float32"]["chosen"] == "reference"
    backend = report["attention_backends"]["TORCH_MLA"]
    assert backend["is_mla"] and backend["layout"] == "MLA"
