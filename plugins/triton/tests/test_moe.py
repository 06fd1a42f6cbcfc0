"""hwplug-triton's ``moe_experts`` (grouped GEMMs over tokens sorted by expert) and its
``fused_moe`` against the reference ops within their stated tolerances.

Without a GPU the kernels run in the Triton interpreter on small shapes: 1 token (decode),
a few, dozens, and all tokens routed to the same three experts (several row tiles per
expert); widths that are not multiples of the tiles.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import DTYPES, ON_GPU, assert_matches, random

from hwplug.kernel_registry import reference
from hwplug_triton.kernels import fused_moe, moe

EXPERTS, HIDDEN, INTERMEDIATE = (64, 1024, 512) if ON_GPU else (8, 48, 40)
TOKENS = [1, 7, 300] if ON_GPU else [1, 5, 37]


def _weights(dtype: torch.dtype, device: str, seed: int = 0):
    w13 = random(EXPERTS, 2 * INTERMEDIATE, HIDDEN, dtype=torch.float32, device=device,
                 seed=seed) * HIDDEN ** -0.5
    w2 = random(EXPERTS, HIDDEN, INTERMEDIATE, dtype=torch.float32, device=device,
                seed=seed + 1) * INTERMEDIATE ** -0.5
    return w13.to(dtype), w2.to(dtype)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_moe_experts_match_the_reference(device, dtype, tokens):
    w13, w2 = _weights(dtype, device)
    x = random(tokens, HIDDEN, dtype=dtype, device=device, seed=2)
    logits = random(tokens, EXPERTS, dtype=torch.float32, device=device, seed=3)
    weights, ids = reference.moe_topk(logits, 3)
    got = moe.moe_experts(x, w13, w2, weights, ids)
    assert_matches("moe_experts", got, reference.moe_experts(x, w13, w2, weights, ids))


def test_experts_chosen_by_every_token_span_several_row_tiles(device):
    w13, w2 = _weights(torch.float32, device)
    x = random(21, HIDDEN, dtype=torch.float32, device=device, seed=6)
    logits = random(21, EXPERTS, dtype=torch.float32, device=device, seed=7)
    logits[:, 2:5] += 10.0  # experts 2, 3, 4: 21 pairs each, two 16-row tiles
    weights, ids = reference.moe_topk(logits, 3)
    assert sorted(ids.unique().tolist()) == [2, 3, 4]
    got = moe.moe_experts(x, w13, w2, weights, ids)
    assert_matches("moe_experts", got, reference.moe_experts(x, w13, w2, weights, ids))


def test_gelu_experts_and_a_missed_expert_id_is_seen(device):
    w13, w2 = _weights(torch.float32, device)
    x = random(6, HIDDEN, dtype=torch.float32, device=device, seed=4)
    weights, ids = reference.moe_topk(random(6, EXPERTS, dtype=torch.float32, device=device,
                                             seed=5), 2)
    got = moe.moe_experts(x, w13, w2, weights, ids, "gelu")
    assert_matches("moe_experts", got, reference.moe_experts(x, w13, w2, weights, ids, "gelu"))
    shifted = moe.moe_experts(x, w13, w2, weights, (ids + 1) % EXPERTS, "gelu")
    assert (shifted - got).abs().max() > 0.05


def test_align_by_expert_gives_each_row_tile_one_expert(device):
    ids = torch.tensor([[3, 0], [3, 5], [5, 3], [0, 7]], device=device)
    pairs, tile_experts = moe.align_by_expert(ids, 8, 4)
    flat = ids.flatten()
    real = pairs < flat.numel()
    assert sorted(pairs[real].tolist()) == list(range(flat.numel()))
    for tile, expert in enumerate(tile_experts.tolist()):
        chunk = pairs[tile * 4:(tile + 1) * 4]
        chunk = chunk[chunk < flat.numel()]
        if expert < 0:
            assert chunk.numel() == 0
        else:
            assert chunk.numel() and (flat[chunk] == expert).all()
    assert sorted(e for e in tile_experts.tolist() if e >= 0) == [0, 3, 5, 7]


def test_fused_moe_with_grouped_sigmoid_routing_and_shared_experts(device):
    w13, w2 = _weights(torch.float32, device)
    shared_w13, shared_w2 = (w[0] for w in _weights(torch.float32, device, seed=7))
    x = random(5, HIDDEN, dtype=torch.float32, device=device, seed=8)
    logits = random(5, EXPERTS, dtype=torch.float32, device=device, seed=9)
    options = dict(scoring="sigmoid", correction_bias=torch.linspace(-0.1, 0.1, EXPERTS,
                                                                     device=device),
                   num_expert_group=2, topk_group=1, routed_scaling_factor=2.0,
                   shared_w13=shared_w13, shared_w2=shared_w2)
    got = fused_moe.fused_moe(x, logits, w13, w2, 2, True, **options)
    assert_matches("fused_moe", got, reference.fused_moe(x, logits, w13, w2, 2, True, **options))


def test_weights_of_another_dtype_are_declined():
    x = torch.zeros(2, HIDDEN)
    w13, w2 = _weights(torch.bfloat16, "cpu")
    ids = torch.zeros(2, 1, dtype=torch.long)
    assert "x's dtype" in moe.supported(x, w13, w2, torch.ones(2, 1), ids)
    assert "x's dtype" in fused_moe.supported(x, torch.zeros(2, EXPERTS), w13, w2, 1)
