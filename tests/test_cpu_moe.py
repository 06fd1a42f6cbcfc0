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
    assert "grouped" in ops_moe.moe_experts.variants_used()
    variant = kernels.get("moe_experts/grouped")
    assert variant.supports(x, w13.bfloat16(), w2, None, None) is not None


def _quantized(kind: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([ggml_weight(generator, kind, rows, cols) for _ in range(EXPERTS)])


@pytest.mark.parametrize("up_type, down_type", [(Q.Q4_K, Q.Q6_K), (Q.Q8_0, Q.Q8_0),
                                                (Q.Q2_K, Q.Q5_K)])
@pytest.mark.parametrize("tokens", [1, 7])
def test_ggml_experts_match_the_reference(up_type, down_type, tokens):
    """Stacked quantized experts as llama.cpp stores them: [E, rows, row_bytes]."""
    cols = 256
    w13 = _quantized(up_type, 2 * 256, cols, seed=2)
    w2 = _quantized(down_type, cols, 256, seed=3)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(tokens, cols, generator=generator)
    weights, ids = reference.moe_topk(torch.randn(tokens, EXPERTS, generator=generator), 3)
    got = moe.ggml_moe_experts(x, w13, int(up_type), w2, int(down_type), weights, ids)
    want = reference.ggml_moe_experts(x, w13, int(up_type), w2, int(down_type), weights, ids)
    _close(got, want, ops_moe.ggml_moe_experts)
    assert got.abs().max() > 0.1  # the weights matter
