"""hwplug-triton's layout-free kernels (rms_norm, gated activations, rotary embedding)
against the reference ops of ``hwplug.kernel_registry`` within each op's stated tolerance.

Without a GPU the kernels run in the Triton interpreter on small shapes (the interpreter
truncates fp32 -> bf16 casts instead of rounding to nearest: one bf16 ulp, inside the bf16
tolerance); on a GPU the shapes are larger.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import DTYPES, ON_GPU, assert_matches, random

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import reference
from hwplug_triton.kernels import activation, norm, rotary

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
