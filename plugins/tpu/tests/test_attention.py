"""``PALLAS_RPA`` on the tpu platform, the torch_xla tombstones, and the conformance kit
(every JAX variant, MoE and MLA ones included, and both attention backends).

The platform is the one discovery makes on JAX's CPU standing in for a TPU
(``JAX_PLATFORMS=cpu`` with ``HWPLUG_PLATFORM=tpu``), the documented way to run the
plugin without a TPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hwplug import registries
from hwplug.attention import AttentionMetadata, AttentionSpec
from hwplug.attention_selection import select_backend
from hwplug.config import EngineConfig
from hwplug.conformance import Budget, run_conformance
from hwplug.errors import RemovedError
from hwplug_tpu.attention import PallasRpaBackend
from hwplug_tpu.layout import RPA_INTERLEAVED

SMOLLM2 = AttentionSpec(num_heads=9, num_kv_heads=3, head_size=64, dtype="float32",
                        kv_cache_dtype="float32", block_size=16)


def _metadata(slots: list[int], seq_len: int) -> AttentionMetadata:
    """One sequence of ``seq_len`` tokens in block 1, its last ones at ``slots``."""
    return AttentionMetadata(torch.tensor(slots), torch.tensor([[1]], dtype=torch.int32),
                             torch.tensor([seq_len], dtype=torch.int32),
                             torch.tensor([0, len(slots)], dtype=torch.int32), len(slots),
                             seq_len)


def test_the_platform_chooses_pallas_rpa_and_its_interleaved_layout(stand_in):
    config = EngineConfig(9, 3, 64, dtype="auto", checkpoint_dtype="bfloat16")
    stand_in.check_and_update_config(config)
    assert (config.dtype, config.attention_backend, config.block_size) == (
        "float32", "PALLAS_RPA", 16)
    assert PallasRpaBackend.kv_cache_shape(10, 16, 3, 64) == (10, 16, 6, 64)
    assert PallasRpaBackend.kv_cache_layout == "RPA_INTERLEAVED"
    assert PallasRpaBackend.validate(SMOLLM2, stand_in) == []
    assert PallasRpaBackend.validate(replace(SMOLLM2, causal=False)) == [
        "non-causal attention not supported"]
    assert PallasRpaBackend.validate(replace(SMOLLM2, kv_cache_dtype="fp8_e4m3")) == [
        "KV-cache dtype fp8_e4m3 not in bfloat16, float32"]


def test_forward_writes_keys_at_even_and_values_at_odd_heads(stand_in):
    backend = PallasRpaBackend(replace(SMOLLM2, num_heads=3))
    cache = torch.zeros(PallasRpaBackend.kv_cache_shape(2, 16, 3, 64))
    key, value, query = torch.randn(3, 3, 64), torch.randn(3, 3, 64), torch.randn(3, 3, 64)
    metadata = _metadata(slots=[16, 17, 18], seq_len=3)
    out = backend.forward(query, key, value, cache, metadata, 0.125)
    torch.testing.assert_close(cache[1, :3, 0::2], key)
    torch.testing.assert_close(cache[1, :3, 1::2], value)
    torch.testing.assert_close(RPA_INTERLEAVED.to_reference(cache)[1, 1, :3], value)
    assert out.shape == query.shape and not cache[0].any()


@pytest.mark.parametrize("name", ["TORCH_XLA", "PALLAS"])
def test_the_torch_xla_path_is_a_tombstone(stand_in, name):
    message = (f"attention backend '{name}' was removed; use 'PALLAS_RPA: TPU support runs "
               "through JAX in hwplug-tpu, not torch_xla' instead")
    with pytest.raises(RemovedError) as error:
        registries.attention_backends.get(name)
    assert str(error.value) == message
    with pytest.raises(RemovedError, match="TPU support runs through JAX in hwplug-tpu"):
        select_backend(stand_in, SMOLLM2, requested=name)
    assert name not in registries.attention_backends.names()


@pytest.mark.slow
def test_conformance_on_jax_cpu(stand_in):
    """The kit against hwplug-tpu on JAX's CPU backend (fewer examples than the CLI's
    default, to keep the test quick): every JAX row matches and reads simulated (JAX CPU
    stands in for the TPU), never passed."""
    report = run_conformance("tpu", Budget(kernel_examples=8, attention_examples=2))
    assert report.ok, report.summary()
    results = {r.check: r for r in report.results}
    for op in ("embedding", "rms_norm", "rotary_embedding", "silu_and_mul", "gelu_and_mul",
               "linear", "reshape_and_cache", "paged_attention", "moe_topk", "moe_experts",
               "fused_moe", "concat_and_cache_mla", "mla_attention"):
        result = results[f"kernel {op}/jax"]
        assert (result.status, result.simulation) == ("simulated", "JAX CPU"), result
    assert "layout RPA_INTERLEAVED" in results["kernel paged_attention/jax"].detail
    assert results["kv layout RPA_INTERLEAVED"].simulation == "JAX CPU"
    # only JAX's TPU kernel needs a TPU: not checked here, and the report says why
    (pallas,) = [r for r in report.not_checked if r.check == "kernel paged_attention/pallas"]
    assert "needs device feature jax-tpu (tpu has: jax-cpu)" in pallas.detail
    for scenario in ("prefill", "chunked prefill", "decode", "speculative verify",
                     "mixed batch", "GQA", "sliding window", "soft cap"):
        result = results[f"attention PALLAS_RPA: {scenario}"]
        assert result.status == "simulated" and "layout RPA_INTERLEAVED" in result.detail
    assert results["attention PALLAS_RPA: non-causal"].status == "skipped"
    for scenario in ("prefill", "chunked prefill", "decode", "speculative verify",
                     "mixed batch"):
        result = results[f"attention JAX_MLA: {scenario}"]
        assert result.status == "simulated" and "layout MLA" in result.detail
    assert results["attention JAX_MLA: validate refuses unclaimed features"].status == "passed"
    assert "numerical checks run on cpu" in results["setup"].detail
    detail = results["platform facts"].detail
    assert "dist_backend 'xla' is not a torch.distributed backend" in detail
    assert "JAX's CPU backend stands in for a TPU" in detail
