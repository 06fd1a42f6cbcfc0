"""hwplug-tpu's mixture-of-experts variants against the pure-torch references: routing
(softmax; sigmoid with a correction bias and grouped top-k; renormalisation on and off),
the experts, and ``fused_moe`` with shared experts, in float32 and bfloat16; and
``fused_moe`` recorded into a compiled step, replayed over routings that change.
"""

from __future__ import annotations

import jax
import pytest
import torch

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference import moe as reference
from hwplug_tpu import variants_moe
from hwplug_tpu.bridge import device, place
from hwplug_tpu.step import JaxStepRecorder

T, H, INTER, E = 7, 32, 16, 8
ROUTINGS = {
    "softmax": dict(top_k=2),
    "softmax-unnormalised": dict(top_k=3, renormalize=False),
    "sigmoid-grouped-bias": dict(top_k=3, scoring="sigmoid", num_expert_group=4, topk_group=2,
                                 routed_scaling_factor=2.5, bias=True),
    "softmax-grouped-unnormalised": dict(top_k=2, renormalize=False, num_expert_group=2,
                                         topk_group=1),
}


def _inputs(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(T, H, generator=g).to(dtype),
                logits=torch.randn(T, E, generator=g).to(dtype),
                w13=(torch.randn(E, 2 * INTER, H, generator=g) * H ** -0.5).to(dtype),
                w2=(torch.randn(E, H, INTER, generator=g) * INTER ** -0.5).to(dtype),
                bias=torch.randn(E, generator=g) * 0.1,
                shared_w13=(torch.randn(2 * INTER, H, generator=g) * H ** -0.5).to(dtype),
                shared_w2=(torch.randn(H, INTER, generator=g) * INTER ** -0.5).to(dtype))


def _routing(name: str, bias: torch.Tensor) -> dict:
    options = dict(ROUTINGS[name])
    top_k = options.pop("top_k")
    if options.pop("bias", False):
        options["correction_bias"] = bias
    return dict(top_k=top_k, **options)


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_routing_chooses_the_references_experts(name):
    t = _inputs(torch.float32)
    routing = _routing(name, t["bias"])
    weights, ids = variants_moe.moe_topk(t["logits"], **routing)
    want_weights, want_ids = reference.moe_topk(t["logits"], **routing)
    assert ids.dtype == torch.int64 and torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-5), (torch.bfloat16, 4e-2)])
@pytest.mark.parametrize("name", ["softmax", "sigmoid-grouped-bias"])
def test_experts_and_fused_moe_with_shared_experts_match_the_reference(name, dtype, tol):
    t = _inputs(dtype)
    routing = _routing(name, t["bias"])
    weights, ids = reference.moe_topk(t["logits"], **routing)
    got = variants_moe.moe_experts(t["x"], t["w13"], t["w2"], weights, ids)
    want = reference.moe_experts(t["x"], t["w13"], t["w2"], weights, ids)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    shared = dict(shared_w13=t["shared_w13"], shared_w2=t["shared_w2"])
    top_k = routing.pop("top_k")
    args = (t["x"], t["logits"], t["w13"], t["w2"], top_k)
    got = variants_moe.fused_moe(*args, **routing, **shared)
    want = reference.fused_moe(*args, **routing, **shared)
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # the shared experts count: without them the output moves
    assert (variants_moe.fused_moe(*args, **routing) - got).abs().max() > 10 * tol


def test_bad_routing_is_refused_as_the_reference_refuses_it():
    t = _inputs(torch.float32)
    with pytest.raises(UnsupportedError, match="scoring 'tanh' is not one of softmax, sigmoid"):
        variants_moe.moe_topk(t["logits"], 2, scoring="tanh")
    with pytest.raises(UnsupportedError, match="do not split into 3 groups"):
        variants_moe.fused_moe(t["x"], t["logits"], t["w13"], t["w2"], 2,
                               num_expert_group=3, topk_group=1)


def test_fused_moe_compiles_once_whatever_the_routing():
    """Recorded into a step, ``fused_moe`` is one compiled program whose routing is data:
    replays over inputs that choose other experts give the op-by-op results."""
    t = _inputs(torch.float32)
    for name in ("w13", "w2", "shared_w13", "shared_w2", "bias"):
        place(t[name], device())
    x, logits = torch.zeros(T, H), torch.zeros(T, E)
    routing = _routing("sigmoid-grouped-bias", t["bias"])
    top_k = routing.pop("top_k")

    def step():
        return variants_moe.fused_moe(x, logits, t["w13"], t["w2"], top_k, **routing,
                                      shared_w13=t["shared_w13"], shared_w2=t["shared_w2"])

    recorder = JaxStepRecorder()
    with recorder.record() as graph:
        graph.outputs = step()
    chosen = []
    for seed in (1, 2, 3):
        fresh = _inputs(torch.float32, seed)
        x.copy_(fresh["x"])
        logits.copy_(fresh["logits"])
        with jax.transfer_guard("disallow_explicit"):
            got = graph.replay().clone()
        torch.testing.assert_close(got, step(), atol=2e-5, rtol=2e-5)
        chosen.append(variants_moe.moe_topk(logits, top_k, **routing)[1])
    assert len(recorder.compiled) == 1
    assert not torch.equal(chosen[0], chosen[1])  # the replays routed differently
