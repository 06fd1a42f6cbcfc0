"""The zoo's decoders on the tpu platform (JAX's CPU standing in) against transformers.

The comparisons of ``tests/test_models_vs_transformers`` run here unchanged, on the tpu
platform: tiny random Llama (plain, llama3 RoPE scaling with tied embeddings), Mistral
and Qwen2 with sliding windows, Qwen2's QKV bias and Qwen3's q/k norms, prefill logits
of sequences of different lengths then decode steps through the paged cache, in float32
and bfloat16. Here the cache is ``PALLAS_RPA``'s interleaved layout and every op the
decoders call is served by hwplug-tpu's JAX variants.
"""

from __future__ import annotations

import pytest
import test_models_vs_transformers as on_any_platform

from hwplug import kernels

#: The ops a decoder calls, each of which the tpu platform must serve with its JAX variant.
JAX_OPS = ("embedding", "rms_norm", "rotary_embedding", "silu_and_mul", "linear",
           "reshape_and_cache", "paged_attention")


def assert_served_by_jax() -> None:
    """Every op ran its JAX variant (the cache ops over ``PALLAS_RPA``'s interleaved
    layout: the JAX variants of that layout served)."""
    for op in JAX_OPS:
        assert kernels.op(op).variants_used() == {"jax"}, op


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(on_any_platform.CONFIGS))
def test_prefill_and_decode_match_transformers(stand_in, name):
    on_any_platform.test_prefill_and_decode_match_transformers(name)
    assert_served_by_jax()


def test_bfloat16_matches_float32_reference(stand_in):
    on_any_platform.test_bfloat16_matches_float32_reference()
    assert_served_by_jax()
