"""The pure-torch reference kernels against independent formulations.

Oracles: ``torch.nn.functional.rms_norm``; transformers' ``rotate_half`` /
``apply_rotary_pos_emb`` (neox) and complex multiplication (GPT-J) for RoPE;
transformers' Llama rotary embedding (``ROPE_INIT_FUNCTIONS``) for the cos/sin cache;
closed-form fp64 activations; a per-token loop for the cache write; an fp64 matmul
with the scales factored out for ``scaled_mm``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from hwplug.attention import PagedAttentionParams
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference import (
    build_cos_sin_cache,
    gelu_and_mul,
    reshape_and_cache,
    rms_norm,
    rotary_embedding,
    scaled_mm,
    silu_and_mul,
)

#: (atol, rtol) against an fp32/fp64 oracle: fp32 differs by summation order only; a
#: bf16 output is one rounding (2**-8 relative) away, plus bf16-rounded intermediates.
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1.6e-2, 1.6e-2)}
#: The cos/sin cache is built like transformers builds it, so it must agree to fp32 noise.
ROPE_CACHE_ATOL = 1e-6
DTYPES = list(TOLERANCES)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- rms_norm -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_matches_torch(dtype):
    x, weight = randn(3, 5, 64, dtype=dtype), randn(64, dtype=dtype, seed=1)
    expected = F.rms_norm(x.double(), (64,), weight.double(), eps=1e-6)
    assert_close(rms_norm(x, weight, 1e-6), expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_with_residual_returns_normed_sum_and_sum(dtype):
    x, residual = randn(7, 32, dtype=dtype), randn(7, 32, dtype=dtype, seed=1)
    weight = randn(32, dtype=dtype, seed=2)
    normed, summed = rms_norm(x, weight, 1e-5, residual=residual)
    assert summed.dtype == dtype and torch.equal(summed, x + residual)
    expected = F.rms_norm(summed.double(), (32,), weight.double(), eps=1e-5)
    assert_close(normed, expected, dtype)


def test_rms_norm_eps_guards_zero_input():
    out = rms_norm(torch.zeros(2, 8), torch.ones(8), 1e-6)
    assert torch.equal(out, torch.zeros(2, 8))


# --- rotary ---------------------------------------------------------------------------

def rotary_inputs(head_size: int, rot_dim: int, dtype: torch.dtype):
    positions = torch.tensor([0, 5, 1, 127, 64, 3])
    query = randn(6, 4, head_size, dtype=dtype, seed=1)
    key = randn(6, 2, head_size, dtype=dtype, seed=2)
    return positions, query, key, build_cos_sin_cache(rot_dim, 128, 10000.0)


def neox_oracle(positions, x, cache):
    """transformers' rotate_half formulation on the rotated slice."""
    rot_dim = cache.shape[1]
    cos, sin = cache[positions].double().chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    rotated, _ = apply_rotary_pos_emb(x[..., :rot_dim].double(), x[..., :rot_dim].double(),
                                      cos, sin, unsqueeze_dim=1)
    return torch.cat((rotated, x[..., rot_dim:].double()), -1)


def gptj_oracle(positions, x, cache):
    """Pairs (2i, 2i+1) as complex numbers, multiplied by e^{i*angle}."""
    rot_dim = cache.shape[1]
    cos, sin = cache[positions].double().chunk(2, dim=-1)
    pairs = torch.view_as_complex(x[..., :rot_dim].double().reshape(*x.shape[:-1], -1, 2))
    rotated = torch.view_as_real(pairs * torch.complex(cos, sin)[:, None, :]).flatten(-2)
    return torch.cat((rotated, x[..., rot_dim:].double()), -1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("rot_dim", [64, 32], ids=["full", "partial"])
def test_rotary_embedding_matches_oracles(dtype, is_neox, rot_dim):
    positions, query, key, cache = rotary_inputs(64, rot_dim, dtype)
    oracle = neox_oracle if is_neox else gptj_oracle
    query_out, key_out = rotary_embedding(positions, query, key, cache, is_neox)
    assert_close(query_out, oracle(positions, query, cache), dtype)
    assert_close(key_out, oracle(positions, key, cache), dtype)
    assert torch.equal(query_out[..., rot_dim:], query[..., rot_dim:])  # passes through


def test_rotary_position_zero_is_identity():
    positions, query, key, cache = rotary_inputs(64, 64, torch.float32)
    zero = torch.zeros_like(positions)
    for is_neox in (True, False):
        query_out, key_out = rotary_embedding(zero, query, key, cache, is_neox)
        assert torch.equal(query_out, query) and torch.equal(key_out, key)


ROPE_SCALINGS = {
    "none": None,
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    # A short original context, so all three llama3 bands (kept, interpolated, scaled) occur.
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    # cos and sin scaled by 0.1 ln(8) + 1; and by DeepSeek's mscale ratio
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 512},
    "yarn-mscale": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024,
                    "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 16, "beta_slow": 2},
}


@pytest.mark.parametrize("scaling", ROPE_SCALINGS.values(), ids=ROPE_SCALINGS.keys())
@pytest.mark.parametrize(("rot_dim", "base"), [(64, 10000.0), (128, 500000.0)])
def test_cos_sin_cache_matches_transformers(scaling, rot_dim, base):
    max_position = 4096
    parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": base}
    config = LlamaConfig(head_dim=rot_dim, hidden_size=4 * rot_dim, num_attention_heads=4,
                         max_position_embeddings=max_position, rope_parameters=parameters)
    cos, sin = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(max_position)[None])
    half = rot_dim // 2
    expected = torch.cat((cos[0, :, :half], sin[0, :, :half]), dim=-1)
    cache = build_cos_sin_cache(rot_dim, max_position, base, scaling)
    assert cache.shape == (max_position, rot_dim) and cache.dtype == torch.float32
    torch.testing.assert_close(cache, expected, atol=ROPE_CACHE_ATOL, rtol=0)


def test_cos_sin_cache_reads_legacy_type_key():
    legacy = build_cos_sin_cache(64, 32, 10000.0, {"type": "linear", "factor": 2.0})
    current = build_cos_sin_cache(64, 32, 10000.0, {"rope_type": "linear", "factor": 2.0})
    assert torch.equal(legacy, current)


def test_cos_sin_cache_rejects_unknown_rope_type_and_odd_dim():
    with pytest.raises(UnsupportedError, match="'longrope'.*default, linear, llama3, yarn"):
        build_cos_sin_cache(64, 32, 10000.0, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="even"):
        build_cos_sin_cache(63, 32, 10000.0)


# --- gated activations ----------------------------------------------------------------

def silu_oracle(gate):
    return gate * torch.sigmoid(gate)


def gelu_erf_oracle(gate):
    return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))


def gelu_tanh_oracle(gate):
    return 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))


GATED = {
    "silu": (silu_and_mul, silu_oracle),
    "gelu": (gelu_and_mul, gelu_erf_oracle),
    "gelu_tanh": (lambda x: gelu_and_mul(x, approximate="tanh"), gelu_tanh_oracle),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", GATED)
def test_gated_activation_matches_closed_form(dtype, name):
    op, oracle = GATED[name]
    x = 3 * randn(4, 3, 2 * 48, dtype=dtype)
    gate, up = x.double().chunk(2, dim=-1)
    assert_close(op(x), oracle(gate) * up, dtype)


@pytest.mark.parametrize("op", [silu_and_mul, gelu_and_mul])
def test_gated_activation_rejects_odd_width(op):
    with pytest.raises(ValueError, match="even"):
        op(torch.zeros(2, 7))


# --- reshape_and_cache ----------------------------------------------------------------

@pytest.mark.parametrize("cache_dtype", DTYPES, ids=str)
def test_reshape_and_cache_writes_exactly_the_slots(cache_dtype):
    num_blocks, block_size, num_kv_heads, head_size = 6, 4, 2, 8
    kv_cache = randn(2, num_blocks, block_size, num_kv_heads, head_size, dtype=cache_dtype)
    before = kv_cache.clone()
    key = randn(6, num_kv_heads, head_size, seed=1)
    value = randn(6, num_kv_heads, head_size, seed=2)
    slot_mapping = torch.tensor([17, -1, 0, 22, -1, 3])  # blocks 4, 0, 5, 0; two padding

    reshape_and_cache(key, value, kv_cache, slot_mapping, PagedAttentionParams(1.0))

    expected = before.clone()
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            expected[0, slot // block_size, slot % block_size] = key[token].to(cache_dtype)
            expected[1, slot // block_size, slot % block_size] = value[token].to(cache_dtype)
    assert torch.equal(kv_cache, expected)
    untouched = [1, 2, 3]  # no slot maps there
    assert torch.equal(kv_cache[:, untouched], before[:, untouched])


# --- scaled_mm ------------------------------------------------------------------------

SCALES = {
    "per_tensor": (torch.tensor(0.5), torch.tensor(2.0)),
    "per_token_channel": (randn(16, 1, seed=3).abs() + 0.5, randn(1, 24, seed=4).abs() + 0.5),
}
INPUT_DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn]


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("in_dtype", INPUT_DTYPES, ids=str)
@pytest.mark.parametrize("scales", SCALES.values(), ids=SCALES.keys())
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_scaled_mm_matches_float_matmul(out_dtype, in_dtype, scales, with_bias):
    scale_a, scale_b = scales
    a, b = randn(16, 32).to(in_dtype), randn(32, 24, seed=1).to(in_dtype)
    bias = randn(24, seed=2) if with_bias else None
    # The scales are per row of a and per column of b, so they factor out of the product.
    expected = (a.double() @ b.double()) * scale_a.double() * scale_b.double()
    if bias is not None:
        expected = expected + bias.double()
    assert_close(scaled_mm(a, b, scale_a, scale_b, out_dtype, bias), expected, out_dtype)
