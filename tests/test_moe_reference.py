"""The mixture-of-experts references against transformers' own MoE blocks.

Qwen3-MoE's and Mixtral's blocks (softmax scoring, renormalised or not) and DeepSeek-V3's
(sigmoid scoring with a correction bias, grouped top-k, a routed scaling factor and
shared experts) hold random weights; ``fused_moe``'s reference, given the same stacked
weights, must give their outputs, and ``moe_topk`` their routing.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DeepseekV3Config, MixtralConfig, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference import fused_moe, moe_experts, moe_topk

HIDDEN, INTERMEDIATE, EXPERTS = 32, 24, 8


def _randomize(block: torch.nn.Module, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in [*block.parameters(), *block.buffers()]:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def _tokens(n: int = 11) -> torch.Tensor:
    return torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_fused_moe_matches_qwen3_moe_block(norm_topk_prob):
    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE,
                            num_experts=EXPERTS, num_experts_per_tok=3,
                            norm_topk_prob=norm_topk_prob)
    block = Qwen3MoeSparseMoeBlock(config).eval()
    _randomize(block)
    x = _tokens()
    with torch.no_grad():
        want = block(x[None])[0]
    logits = x @ block.gate.weight.T
    got = fused_moe(x, logits, block.experts.gate_up_proj, block.experts.down_proj, 3,
                    norm_topk_prob)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_moe_matches_mixtral_block():
    config = MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                           num_local_experts=EXPERTS, num_experts_per_tok=2)
    block = MixtralSparseMoeBlock(config).eval()
    _randomize(block)
    x = _tokens()
    with torch.no_grad():
        want = block(x[None])[0]
    got = fused_moe(x, x @ block.gate.weight.T, block.experts.gate_up_proj,
                    block.experts.down_proj, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fused_moe_matches_deepseek_v3_block():
    """Sigmoid scores, correction bias, 4 groups of which 2 are eligible, scaling 2.5, and
    one shared expert."""
    config = DeepseekV3Config(hidden_size=HIDDEN, moe_intermediate_size=INTERMEDIATE,
                              n_routed_experts=EXPERTS, num_experts_per_tok=3, n_group=4,
                              topk_group=2, n_shared_experts=1, routed_scaling_factor=2.5,
                              norm_topk_prob=True)
    block = DeepseekV3MoE(config).eval()
    _randomize(block)
    x = _tokens(17)
    with torch.no_grad():
        want = block(x[None])[0]
        _, want_weights, want_ids = block.gate(x)
    logits = x @ block.gate.weight.T
    shared = block.shared_experts
    routing = dict(scoring="sigmoid", correction_bias=block.gate.e_score_correction_bias,
                   num_expert_group=4, topk_group=2, routed_scaling_factor=2.5)
    weights, ids = moe_topk(logits, 3, True, **routing)
    order = want_ids.sort(-1).indices  # transformers' top-k is unsorted
    assert torch.equal(ids.sort(-1).values, want_ids.sort(-1).values)
    torch.testing.assert_close(weights.gather(1, ids.sort(-1).indices),
                               want_weights.gather(1, order))
    got = fused_moe(x, logits, block.experts.gate_up_proj, block.experts.down_proj, 3, True,
                    **routing,
                    shared_w13=torch.cat([shared.gate_proj.weight, shared.up_proj.weight]),
                    shared_w2=shared.down_proj.weight)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_grouped_top_k_only_picks_from_the_best_groups():
    logits = torch.tensor([[5.0, 0.0, 4.0, 4.0, 0.0, 0.0, 1.0, 1.0]])
    # groups of two: scores by max are 5, 4, 0, 1 -> groups 0 and 1 eligible
    _, ids = moe_topk(logits, 3, num_expert_group=4, topk_group=2)
    assert sorted(ids[0].tolist()) == [0, 2, 3]
    _, ungrouped = moe_topk(logits, 4)
    assert 6 in ungrouped[0].tolist()


def test_renormalize_sums_weights_to_the_scaling_factor():
    logits = torch.randn(5, EXPERTS, generator=torch.Generator().manual_seed(2))
    weights, _ = moe_topk(logits, 2, True, routed_scaling_factor=3.0)
    torch.testing.assert_close(weights.sum(-1), torch.full((5,), 3.0))
    raw, _ = moe_topk(logits, 2, False)
    assert (raw.sum(-1) < 1).all()


def test_moe_experts_skips_nothing_it_is_given():
    """Each slot's contribution is its weight times its expert's MLP: zero weight, zero
    contribution; the sum over slots is linear."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(4, HIDDEN, generator=generator)
    w13 = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, generator=generator)
    w2 = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE, generator=generator)
    ids = torch.tensor([[0, 5], [5, 7], [2, 2], [7, 0]])
    weights = torch.rand(4, 2, generator=generator)
    both = moe_experts(x, w13, w2, weights, ids)
    first = moe_experts(x, w13, w2, weights * torch.tensor([1.0, 0.0]), ids)
    second = moe_experts(x, w13, w2, weights * torch.tensor([0.0, 1.0]), ids)
    torch.testing.assert_close(both, first + second, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: moe_topk(torch.zeros(2, 8), 9), "top_k 9"),
    (lambda: moe_topk(torch.zeros(2, 8), 2, scoring="relu"), "scoring 'relu'"),
    (lambda: moe_topk(torch.zeros(2, 8), 2, num_expert_group=3, topk_group=1), "3 groups"),
    (lambda: moe_topk(torch.zeros(2, 8), 2, num_expert_group=4), "both"),
    (lambda: moe_experts(torch.zeros(2, 4), torch.zeros(3, 6, 4), torch.zeros(3, 4, 3),
                         torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.long), "tanh"),
     "activation 'tanh'"),
    (lambda: moe_experts(torch.zeros(2, 4), torch.zeros(3, 6, 4), torch.zeros(3, 4, 2),
                         torch.zeros(2, 1), torch.zeros(2, 1, dtype=torch.long)), "do not fit"),
])
def test_bad_calls_raise_unsupported_error_naming_the_problem(call, match):
    with pytest.raises(UnsupportedError, match=match):
        call()
