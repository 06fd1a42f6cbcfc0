"""``hwplug_triton.register``: one variant per op, with the caller's gates on top of the
triton requirement, lazily importable, its ``supported`` check attached."""

from __future__ import annotations

import inspect

from triton_cases import fresh_registry

from hwplug.dtypes import FLOAT_DTYPES
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug_triton import FP8_OPS, MLA_OPS, NHD_OPS, register
from hwplug_triton.registration import KERNEL_MODULES, TRITON_REQUIREMENT


def test_register_adds_one_gated_lazy_variant_per_op() -> None:
    registry = fresh_registry()
    register(registry, platforms=("cpu",), name="triton_test",
             ops=(*NHD_OPS, *MLA_OPS, *FP8_OPS), min_capability="2.0",
             packages={"acmelib": ">=1"})
    dispatch_dtypes = {"ggml_embedding": (), "scaled_mm": ("fp8_e4m3", "fp8_e5m2")}
    for op in KERNEL_MODULES:
        (variant,) = [v for v in registry.variants(op) if v.name == "triton_test"]
        assert (variant.requirements.platforms, variant.requirements.min_capability,
                variant.priority) == (
            ("cpu",), "2.0", 10)
        assert variant.requirements.packages == {"triton": TRITON_REQUIREMENT, "acmelib": ">=1"}
        assert variant.requirements.dtypes == dispatch_dtypes.get(op, FLOAT_DTYPES)
        assert isinstance(variant.impl, str)  # nothing imported yet
        variant.load()
        module = inspect.getmodule(variant.supports)
        assert module.__name__ == f"hwplug_triton.kernels.{KERNEL_MODULES[op]}"
        assert variant.impl is getattr(module, op).unchecked


def test_only_the_named_ops_are_registered_and_gates_explain_rejections() -> None:
    registry = fresh_registry()
    register(registry, platforms=("cpu",), packages={"acmelib": ">=1"})
    assert not [v for v in registry.variants("scaled_mm") if v.name == "triton"]
    why = registry.explain("rms_norm", CpuPlatform(), "cpu", "float32")
    assert why.chosen.name == "reference"
    assert why.rejected["triton"] == "package acmelib not installed (needs >=1)"
    for op in MLA_OPS:  # registered by default: every GPU plugin's MLA backend runs them
        assert sorted(v.name for v in registry.variants(op)) == ["reference", "triton"]


def test_fp8_ops_are_registered_only_when_asked_with_their_own_gate() -> None:
    """``scaled_mm`` needs fp8 dots: a plugin registers it in a call of its own, with its
    devices' fp8 gate."""
    registry = fresh_registry()
    register(registry, platforms=("cpu",))
    assert [v.name for v in registry.variants("scaled_mm")] == ["reference"]
    register(registry, platforms=("cpu",), ops=FP8_OPS, min_capability="8.9")
    platform = CpuPlatform()
    why = registry.explain("scaled_mm", platform, "cpu", "fp8_e4m3")
    assert why.rejected["triton"] == "needs a device capability; the platform reports none"
    assert registry.explain("scaled_mm", platform, "cpu", "int8").rejected[
        "triton"] == "dtype int8 not in fp8_e4m3, fp8_e5m2"
    for op, dtype in (("ggml_linear", "bfloat16"), ("ggml_embedding", "int32")):
        assert registry.explain(op, platform, "cpu", dtype).chosen.name == "triton"


def test_a_plugin_registers_its_own_kernel_modules_for_the_layout_they_serve() -> None:
    """A layout of the plugin's own: the cache ops' kernels from its modules, declared for
    that layout only, so the NHD ops keep their variants."""
    registry = fresh_registry()
    modules = {"paged_attention": "hwplug_triton.kernels.attention"}  # a stand-in module
    register(registry, platforms=("cpu",), name="triton_own", ops=tuple(modules),
             modules=modules, layouts=("OWN",))
    (variant,) = [v for v in registry.variants("paged_attention") if v.name == "triton_own"]
    assert variant.layouts == ("OWN",) and variant.description == "hwplug-triton kernel (attention)"
    why = registry.explain("paged_attention", CpuPlatform(), "cpu", "float32")
    assert why.rejected["triton_own"] == "serves layouts OWN, not NHD"
    assert registry.explain("paged_attention", CpuPlatform(), "cpu", "float32",
                            layout="OWN").chosen.name == "triton_own"
