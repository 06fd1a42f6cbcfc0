"""The cpu platform's mixture-of-experts variants (tokens grouped by expert) against the
pure-torch references: unquantized in fp32 and bf16, with shared experts, GGUF blocks
(K-quants and Q8_0) kept quantized; experts no token chose are never read, and a step runs
one MLP per active expert."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType

from hwplug import current_platform, kernels
from hwplug.kernel_registry import moe_compose, ops_moe
from hwplug.kernel_registry.reference import moe as reference
from hwplug.kernel_registry.reference.ggml_weights import ggml_weight
from hwplug.platforms.cpu import moe

Q = GGMLQuantizationType
H, INTERMEDIATE, EXPERTS = 64, 32, 8


def _weights(seed: int = 0, experts: int = EXPERTS) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * INTERMEDIATE, H, generator=generator) * H ** -0.5
    w2 = torch.randn(experts, H, INTERMEDIATE, generator=generator) * INTERMEDIATE ** -0.5
    return w13, w2


def _inputs(tokens: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, H, generator=generator),
            torch.randn(tokens, EXPERTS, generator=generator))


def _close(got: torch.Tensor, want: torch.Tensor, op=ops_moe.moe_experts) -> None:
    atol, rtol = op.tolerances[str(want.dtype).removeprefix("torch.")]
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)


@pytest.fixture(autouse=True)
def _discovered():
    current_platform()  # the cpu plugin registers its variants


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_grouped_experts_match_the_reference(tokens, dtype):
    w13, w2 = (w.to(dtype) for w in _weights())
    x, logits = _inputs(tokens)
    weights, ids = reference.moe_topk(logits, 3)
    got = moe.moe_experts(x.to(dtype), w13, w2, weights, ids)
    _close(got, reference.moe_experts(x.to(dtype), w13, w2, weights, ids))


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_fused_moe_with_shared_experts_matches_the_reference(activation):
    w13, w2 = _weights()
    shared_w13, shared_w2 = (w[0] for w in _weights(seed=5, experts=1))
    x, logits = _inputs(6)
    routing = dict(scoring="sigmoid", correction_bias=torch.linspace(-0.2, 0.2, EXPERTS),
                   num_expert_group=4, topk_group=2, routed_scaling_factor=1.5)
    got = moe_compose.fused_moe(x, logits, w13, w2, 3, True, activation=activation,
                        shared_w13=shared_w13, shared_w2=shared_w2, **routing)
    want = reference.fused_moe(x, logits, w13, w2, 3, True, activation=activation,
                               shared_w13=shared_w13, shared_w2=shared_w2, **routing)
    _close(got, want, ops_moe.fused_moe)


def test_experts_no_token_chose_are_never_read():
    """The unchosen experts' weights are NaN: any read of them would reach the output."""
    w13, w2 = _weights()
    x, logits = _inputs(5)
    weights, ids = reference.moe_topk(logits, 2)
    unused = sorted(set(range(EXPERTS)) - set(ids.flatten().tolist()))
    assert unused
    w13[unused], w2[unused] = float("nan"), float("nan")
    out = moe.moe_experts(x, w13, w2, weights, ids)
    assert torch.isfinite(out).all()


def test_one_mlp_per_active_expert_whatever_the_token_count():
    """A step's projections run once per distinct chosen expert, on all its tokens."""
    w13, w2 = _weights()
    x, logits = _inputs(9)
    weights, ids = reference.moe_topk(logits, 4)
    calls: list[tuple[int, int]] = []

    def up(rows, expert):
        calls.append((expert, rows.shape[0]))
        return rows @ w13[expert].T

    out = moe.grouped_experts(x, weights, ids, EXPERTS, up, lambda r, e: r @ w2[e].T, "silu")
    counts = torch.bincount(ids.flatten(), minlength=EXPERTS)
    assert calls == [(e, int(n)) for e, n in enumerate(counts.tolist()) if n]
    _close(out, reference.moe_experts(x, w13, w2, weights, ids))


def test_the_registry_dispatches_moe_to_the_grouped_variants():
    w13, w2 = _weights()
    x, logits = _inputs(2)
    ops_moe.fused_moe(x, logits, w13, w2, 2)
    assert "grouped" in ops_moe.fused_moe.variants_used()
    # up to 16 fp32 tokens the one-call C variant where the CPU has AVX2
    # (tests/test_fused_moe_c.py), the grouped variant from 17
    assert ops_moe.moe_experts.variants_used() <= {"fused_avx2", "fused_c", "grouped"}
    ops_moe.fused_moe(*_inputs(17), w13, w2, 2)
    assert "grouped" in ops_moe.moe_experts.variants_used()
    variant = kernels.get("moe_experts/grouped")
    assert variant.supports(x, w13.bfloat16(), w2, None, None) is not None


def _quantized(kind: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([ggml_weight(generator, kind, rows, cols) for _ in range(EXPERTS)])


def _ggml_variant(name: str):
    """The cpu plugin's ``ggml_moe_experts/<name>``, its C library built (the test skips
    where this CPU lacks the build's features)."""
    variant = kernels.get(f"ggml_moe_experts/{name}")
    if reason := variant.device_rejection(current_platform()):
        pytest.skip(f"{name}: {reason}")
    variant.load()
    variant.native.ensure_built()
    return variant


@pytest.mark.parametrize("name", ["grouped_vnni", "grouped_avx2", "grouped_c"])
@pytest.mark.parametrize("up_type, down_type", [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q8_0),
                                                (Q.Q2_K, Q.Q5_K)])
@pytest.mark.parametrize("tokens", [1, 7])
def test_ggml_experts_match_the_reference(up_type, down_type, tokens, name):
    """Stacked quantized experts as llama.cpp stores them: [E, rows, row_bytes]."""
    cols = 256
    w13 = _quantized(up_type, 2 * 256, cols, seed=2)
    w2 = _quantized(down_type, cols, 256, seed=3)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(tokens, cols, generator=generator)
    weights, ids = reference.moe_topk(torch.randn(tokens, EXPERTS, generator=generator), 3)
    args = (x, w13, int(up_type), w2, int(down_type), weights, ids)
    variant = _ggml_variant(name)
    assert variant.supports(*args) is None
    got = variant.impl(*args)
    _close(got, reference.ggml_moe_experts(*args), ops_moe.ggml_moe_experts)
    assert got.abs().max() > 0.1  # the weights matter


@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_ggml_experts_rows_are_ggml_linears(tokens):
    """Each (token, slot)'s expert output is ``ggml_linear`` of that token's row against the
    expert's gate/up rows, then of its activation against the down rows (bitwise: the same
    kernel on the same rows, however many tokens share the expert), weighted and summed."""
    from hwplug.kernel_registry.ops_ggml import ggml_linear

    w13 = _quantized(Q.Q4_K, 2 * 256, 256, seed=2)
    w2 = _quantized(Q.Q6_K, 256, 256, seed=3)
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(tokens, 256, generator=generator)
    weights, ids = reference.moe_topk(torch.randn(tokens, EXPERTS, generator=generator), 3)
    variant = _ggml_variant("grouped_vnni")
    got = variant.impl(x, w13, int(Q.Q4_K), w2, int(Q.Q6_K), weights, ids)
    want = torch.zeros_like(x)
    for t in range(tokens):
        for slot in range(3):
            e = int(ids[t, slot])
            h = ggml_linear(x[t:t + 1], w13[e], int(Q.Q4_K))
            hidden = torch.nn.functional.silu(h[:, :256]) * h[:, 256:]
            want[t] += weights[t, slot] * ggml_linear(hidden, w2[e], int(Q.Q6_K))[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_ggml_experts_decline_stacks_the_kernel_does_not_take():
    """A 2-D weight, stacks of different expert counts, or rows of another length are
    declined with the reason (another variant or the reference serves the call)."""
    w13 = _quantized(Q.Q4_K, 2 * 256, 256, seed=2)
    w2 = _quantized(Q.Q4_K, 256, 256, seed=3)
    x = torch.randn(2, 256)
    weights, ids = reference.moe_topk(torch.randn(2, EXPERTS), 3)
    variant = _ggml_variant("grouped_vnni")
    q4k = int(Q.Q4_K)
    assert variant.supports(x, w13, q4k, w2, q4k, weights, ids) is None
    assert "stack" in variant.supports(x, w13[0], q4k, w2, q4k, weights, ids)
    assert "expert count" in variant.supports(x, w13, q4k, w2[:4], q4k, weights, ids)
    assert "values" in variant.supports(torch.randn(2, 512), w13, q4k,
                                        _quantized(Q.Q4_K, 512, 256, seed=3), q4k, weights, ids)
