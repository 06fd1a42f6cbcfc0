"""Kernels bound when a model is built: a plan per model, a variant per token bucket, used by
every step without resolving again."""

from __future__ import annotations

import warnings

import pytest
import torch
from model_harness import InMemoryCheckpoint, PagedBatch
from tiny_models import random_state
from toy_ops import tagged, toy_registry

import hwplug
from hwplug.attention import AttentionSpec
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry import KernelPlan, KernelPolicy, KernelRegistry, kernels
from hwplug.kernel_registry.native import BuildStatus
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.layers import RMSNorm
from hwplug.model_zoo.layers.attention import make_backend
from hwplug.model_zoo.plan_report import layer_kernels


@pytest.fixture
def reg(fresh_discovery) -> KernelRegistry:
    registry = toy_registry()
    registry.register_variant("double", "one_row", tagged(1.0), num_tokens=(1, 2), priority=9)
    registry.register_variant("double", "many", tagged(5.0), num_tokens=(2, None), priority=8)
    return registry


def test_a_bound_op_holds_a_variant_per_token_bucket(reg):
    bound = KernelPlan(reg, fresh_platform()).bind("double", "float32")
    assert [(b.low, b.high, b.chosen) for b in bound.buckets] == [
        (0, 1, "reference"), (1, 2, "one_row"), (2, None, "many")]
    assert bound.describe() == "reference [0, 1), one_row > reference [1, 2), " \
                               "many > reference [2, inf)"
    assert bound(torch.zeros(1)).tolist() == [1.0] and bound(torch.zeros(3)).tolist() == [5.0] * 3
    assert bound.used() == {"one_row", "many"} == reg.op("double").variants_used()
    with pytest.raises(UnsupportedError, match="double was bound for float32 and called with "
                                               "float64"):
        bound(torch.zeros(2, dtype=torch.float64))


def test_a_plan_made_is_not_changed_by_later_registrations(reg):
    plan = KernelPlan(reg, fresh_platform())
    bound = plan.bind("double", "float32")
    reg.register_variant("double", "newer", tagged(9.0), priority=99)
    assert plan.bind("double", "float32") is bound and bound(torch.zeros(3)).tolist() == [5.0] * 3
    assert KernelPlan(reg, fresh_platform()).bind("double", "float32")(
        torch.zeros(3)).tolist() == [9.0] * 3
    assert reg.op("double")(torch.zeros(3)).tolist() == [9.0] * 3  # the default plan: remade


def test_the_policy_is_the_plans_own(reg):
    disabled = KernelPlan(reg, fresh_platform(), KernelPolicy(disabled=frozenset({"many"})))
    assert disabled.bind("double", "float32").buckets[2].chosen == "reference"
    strict = KernelPlan(reg, fresh_platform(), KernelPolicy(strict=True))
    assert [v.name for v in strict.bind("double", "float32").buckets[1].chain] == ["one_row"]
    with pytest.raises(ConfigError, match="HWPLUG_DISABLED_KERNELS names unknown kernel "
                                          "variants: nope"):
        KernelPlan(reg, fresh_platform(), KernelPolicy(disabled=frozenset({"nope"})))


class FakeLibrary:
    """A native library whose builds are counted (status: not built yet)."""

    def __init__(self) -> None:
        self.builds = 0

    def status(self) -> BuildStatus:
        return BuildStatus("fake", "built" if self.builds else "absent")

    def ensure_built(self) -> BuildStatus:
        self.builds += 1
        return BuildStatus("fake", "built")

    def forget_failure(self) -> bool:
        return False


def test_binding_builds_native_libraries_and_an_explaining_plan_does_not(reg):
    library = FakeLibrary()
    reg.register_variant("double", "native", tagged(3.0), priority=50, native=library)
    explaining = KernelPlan(reg, fresh_platform(), build=False).bind("double", "float32")
    assert explaining.buckets[2].chosen == "native" and library.builds == 0
    bound = KernelPlan(reg, fresh_platform()).bind("double", "float32")
    assert library.builds == 1 and bound(torch.zeros(2)).tolist() == [3.0, 3.0]


def fresh_platform():
    return hwplug.current_platform()


@pytest.fixture(scope="module")
def tiny_model():
    config, state = random_state("llama")
    return build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8)


def test_every_layer_calls_ops_its_models_plan_bound(tiny_model):
    model, ctx = tiny_model
    rows = layer_kernels(model)
    layers = {layers for layers, _, _ in rows}
    assert {"model.layers.*.input_layernorm.rms_norm", "model.layers.*.mlp.act.silu_and_mul",
            "model.layers.*.self_attn.attn.backend._attend",
            "model.layers.*.self_attn.qkv_proj.gemm_kernel", "model.embed_tokens.embed_kernel",
            "lm_head.gemm_kernel"} <= layers
    ops = {op.split(" ")[0] for _, op, _ in rows}
    assert ops == {op.op for op in ctx.kernels.bound()} >= {
        "rms_norm", "linear", "embedding", "rotary_embedding", "silu_and_mul",
        "reshape_and_cache", "paged_attention"}


def test_steps_never_resolve_kernels_again(tiny_model, monkeypatch):
    """After the build, a whole prefill and decode run without the registry being asked."""
    model, ctx = tiny_model

    def explain(*args, **kwargs):
        raise AssertionError("a step asked the registry to choose a kernel")

    monkeypatch.setattr(kernels, "explain", explain)
    batch = PagedBatch(ctx, model.num_layers, 1, 16)
    with torch.inference_mode():
        batch.run(model, [torch.tensor([5, 17, 3, 9])], [4])  # prefill
        hidden = batch.run(model, [torch.tensor([1])], [5])  # a decode step
    assert torch.isfinite(model.compute_logits(hidden)).all()


def test_layers_and_backends_built_the_old_way_still_work_and_say_so(fresh_discovery):
    with pytest.warns(DeprecationWarning, match="RMSNorm was built without the model's context"):
        norm = RMSNorm(64, 1e-6, torch.float32)
    x = torch.randn(3, 64)
    torch.testing.assert_close(norm(x), hwplug.ops.rms_norm.reference(x, norm.weight, 1e-6))

    class OldBackend(TorchPagedBackend):
        def __init__(self, spec):  # the signature written before backends took kernels
            super().__init__(spec)

        @classmethod
        def get_name(cls) -> str:
            return "OLD"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = make_backend(OldBackend, AttentionSpec(4, 2, 64), object())
    assert isinstance(backend, OldBackend)
    assert any("OldBackend.__init__ takes no kernels" in str(w.message) for w in caught)
