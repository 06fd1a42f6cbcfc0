"""The conformance kit on the mixture-of-experts ops: every registered ``moe_topk``,
``moe_experts``, ``fused_moe``, ``ggml_moe_experts``, ``fp8_moe_experts`` and
``int8_moe_experts`` variant is checked against the reference, and deliberately broken
ones, registered here, fail: a wrong expert index, a skipped slot, a missed
renormalisation, a lost correction bias, a shared expert left out, an fp8 tile's scale
read from another tile or one scale for a whole matrix, an int8 channel's scale from
another channel."""

from __future__ import annotations

import pytest

from hwplug import current_platform, kernels
from hwplug.conformance import check_variant
from hwplug.kernel_registry.reference import moe, moe_quant
from hwplug.registry import current_source

OPS = ("moe_topk", "moe_experts", "fused_moe", "ggml_moe_experts", "fp8_moe_experts",
       "int8_moe_experts")


@pytest.fixture
def private_variants(fresh_discovery):
    """Register variants under a private source; drop them afterwards."""
    current_platform()
    token = current_source.set("test_conformance_moe")
    yield kernels
    current_source.reset(token)
    kernels.drop_source("test_conformance_moe")


def _wrong_expert(x, w13, w2, weights, ids, activation="silu"):
    return moe.moe_experts(x, w13, w2, weights, (ids + 1) % w13.shape[0], activation)


def _skips_last_slot(x, w13, w2, weights, ids, activation="silu"):
    return moe.moe_experts(x, w13, w2, weights[:, :-1], ids[:, :-1], activation)


def _never_renormalizes(logits, top_k, renormalize=True, **options):
    return moe.moe_topk(logits, top_k, False, **options)


def _ignores_the_correction_bias(logits, top_k, renormalize=True, **options):
    options.pop("correction_bias", None)
    return moe.moe_topk(logits, top_k, renormalize, **options)


def _fused_never_renormalizes(x, logits, w13, w2, top_k, renormalize=True, **options):
    return moe.fused_moe(x, logits, w13, w2, top_k, False, **options)


def _fused_wrong_expert(x, logits, w13, w2, top_k, renormalize=True, *, activation="silu",
                        shared_w13=None, shared_w2=None, **routing):
    weights, ids = moe.moe_topk(logits, top_k, renormalize, **routing)
    out = _wrong_expert(x, w13, w2, weights, ids, activation)
    if shared_w13 is None:
        return out
    return out + moe.fused_moe(x, logits, w13, w2, top_k, renormalize, activation=activation,
                               shared_w13=shared_w13, shared_w2=shared_w2, **routing) \
        - moe.fused_moe(x, logits, w13, w2, top_k, renormalize, activation=activation,
                        **routing)


def _fused_drops_shared_experts(x, logits, w13, w2, top_k, renormalize=True, *,
                                shared_w13=None, shared_w2=None, **options):
    return moe.fused_moe(x, logits, w13, w2, top_k, renormalize, **options)


def _ggml_wrong_expert(x, w13, w13_type, w2, w2_type, weights, ids, activation="silu"):
    return moe.ggml_moe_experts(x, w13, w13_type, w2, w2_type, weights,
                                (ids + 1) % w13.shape[0], activation)


def _fp8_tiles_transposed(x, w13, s13, w2, s2, weights, ids, activation="silu",
                          block_shape=(128, 128)):
    """Reads each tile's scale at the mirrored tile index (last tile first)."""
    return moe_quant.fp8_moe_experts(x, w13, s13.flip(-1, -2), w2, s2.flip(-1, -2), weights,
                                     ids, activation, block_shape)


def _fp8_one_scale_per_matrix(x, w13, s13, w2, s2, weights, ids, activation="silu",
                              block_shape=(128, 128)):
    """Applies each expert matrix's mean scale to all its tiles."""
    def flat(scale):
        return scale.mean((-1, -2), keepdim=True).expand_as(scale).contiguous()
    return moe_quant.fp8_moe_experts(x, w13, flat(s13), w2, flat(s2), weights, ids,
                                     activation, block_shape)


def _int8_channels_shifted(x, w13, s13, w2, s2, weights, ids, activation="silu"):
    return moe_quant.int8_moe_experts(x, w13, s13.roll(1, -1), w2, s2.roll(1, -1), weights,
                                      ids, activation)


def _int8_wrong_expert(x, w13, s13, w2, s2, weights, ids, activation="silu"):
    return moe_quant.int8_moe_experts(x, w13, s13, w2, s2, weights, (ids + 1) % w13.shape[0],
                                      activation)


BROKEN = {
    ("fp8_moe_experts", "tiles_transposed"): _fp8_tiles_transposed,
    ("fp8_moe_experts", "one_scale_per_matrix"): _fp8_one_scale_per_matrix,
    ("int8_moe_experts", "channels_shifted"): _int8_channels_shifted,
    ("int8_moe_experts", "wrong_expert"): _int8_wrong_expert,
    ("moe_experts", "wrong_expert"): _wrong_expert,
    ("moe_experts", "skips_last_slot"): _skips_last_slot,
    ("moe_topk", "never_renormalizes"): _never_renormalizes,
    ("moe_topk", "ignores_the_correction_bias"): _ignores_the_correction_bias,
    ("fused_moe", "never_renormalizes"): _fused_never_renormalizes,
    ("fused_moe", "wrong_expert"): _fused_wrong_expert,
    ("fused_moe", "drops_shared_experts"): _fused_drops_shared_experts,
    ("ggml_moe_experts", "wrong_expert"): _ggml_wrong_expert,
}


@pytest.mark.parametrize("op, name", sorted(BROKEN))
def test_a_broken_moe_variant_fails(op, name, private_variants):
    private_variants.register_variant(op, name, BROKEN[(op, name)], dtypes=("float32",))
    result = check_variant(f"{op}/{name}", examples=30)
    assert result.status == "failed" and "max abs error" in result.detail, result


@pytest.mark.parametrize("op", OPS)
def test_every_registered_moe_variant_passes(op, private_variants):
    """The registry's own variants of the MoE ops (the cpu platform's here), each checked
    against the reference; the test fails if an op had none to check."""
    variants = [v for v in kernels.variants(op) if v.name != kernels.REFERENCE]
    checked = [check_variant(v, examples=15) for v in variants
               if v.requirements.platforms in (None, (), ("cpu",))]
    assert checked or op == "moe_topk", f"no variant of {op} to check"
    for result in checked:
        assert result.status == "passed", result
