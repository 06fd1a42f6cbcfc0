"""One requirements type for variants, attention backends and quant methods, and the
platform's lists derived from what is registered for it."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from hwplug import registries
from hwplug.attention import AttentionSpec
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.torch_paged import TorchPagedBackend
from hwplug.model_zoo.quant_methods import quant_method_for
from hwplug.model_zoo.quant_methods.unquantized import UnquantizedLinearMethod
from hwplug.platforms.cpu.platform import CpuPlatform
from hwplug.platforms.sighting import DeviceKind
from hwplug.registry import current_source
from hwplug.requirements import Requirements

CPU = CpuPlatform(DeviceKind("cpu", "generic", None).sighting(
    ["Test CPU"], "test", details={"features": "x86_64 avx2"}))


@pytest.mark.parametrize("requirements, dtype, reasons", [
    (Requirements(), "float32", []),
    (Requirements(platforms=("cuda",)), "float32", ["serves platform cuda, not cpu"]),
    (Requirements(platforms=("cpu",), dtypes=("bfloat16",)), "float32",
     ["dtype float32 not in bfloat16"]),
    (Requirements(features=("avx512f", "avx2")), None,
     ["needs device feature avx512f (cpu has: avx2, x86_64)"]),
    (Requirements(min_capability="8.0"), None,
     ["needs a device capability; the platform reports none"]),
    (Requirements(min_toolkit="12.1"), None, ["toolkit absent below 12.1"]),
    (Requirements(packages={"no-such-dist": ">=1"}), None,
     ["package no-such-dist not installed (needs >=1)"]),
    (Requirements(packages={"torch": ">=99"}), None,
     [f"torch {torch.__version__} does not satisfy >=99"]),
    # a missing feature is reported alone: the later device gates are not asked
    (Requirements(dtypes=("int8",), features=("x",), min_toolkit="1"), "float32",
     ["dtype float32 not in int8", "needs device feature x (cpu has: avx2, x86_64)"]),
])
def test_one_requirements_type_says_why_in_one_way(requirements, dtype, reasons):
    assert requirements.reasons(CPU, dtype) == reasons
    assert requirements.reasons(None, "float32") == [r for r in reasons if "dtype" in r]


class NeedsCapability(UnquantizedLinearMethod):
    min_capability: ClassVar[str | None] = "9.0"

    @classmethod
    def get_name(cls) -> str:
        return "needs_capability"


class NeedsFeature(UnquantizedLinearMethod):
    @classmethod
    def get_name(cls) -> str:
        return "needs_feature"

    @classmethod
    def requirements(cls) -> Requirements:
        return Requirements(dtypes=cls.supported_dtypes, features=("amx_int8",))


class CpuBackend(TorchPagedBackend):
    platforms: ClassVar[tuple[str, ...]] = ("cpu",)

    @classmethod
    def get_name(cls) -> str:
        return "CPU_ONLY"


@pytest.fixture
def registered(fresh_discovery):
    """The cpu platform with two quant methods and a backend registered as a plugin would
    (dropped again afterwards)."""
    platform = fresh_discovery.current_platform()
    token = current_source.set("test plugin")
    try:
        registries.quant_methods.register("needs_capability", NeedsCapability)
        registries.quant_methods.register("needs_feature", NeedsFeature)
        registries.attention_backends.register("CPU_ONLY", CpuBackend)
    finally:
        current_source.reset(token)
    yield platform
    for registry in registries.every():
        registry.drop_source("test plugin")


def test_a_registered_quant_method_runs_where_its_requirements_hold(registered):
    platform = registered
    runs = platform.quant_methods()
    # a CPU reports no capability: a capability bound is for devices that report one
    assert "needs_capability" in runs and "gguf" in runs and "needs_feature" not in runs
    assert quant_method_for({"quant_method": "needs_capability"}, platform,
                            "float32").get_name() == "needs_capability"
    with pytest.raises(UnsupportedError, match="quantization 'needs_feature' cannot run on "
                                               "platform 'cpu' .*: needs device feature "
                                               "amx_int8"):
        quant_method_for({"quant_method": "needs_feature"}, platform, "float32")
    assert platform.describe()["quant_methods"] == list(runs)


def test_backends_declared_for_a_platform_follow_its_priority_list(registered):
    platform = registered
    backends, priority = platform.attention_backends(), platform.facts.attention_backend_priority
    assert backends[:len(priority)] == tuple(priority)  # its own list first, then the plugin's
    assert backends[len(priority)] == "CPU_ONLY"
    assert "TRITON_ATTN" not in platform.attention_backends()  # declared for cuda
    assert CpuBackend.validate(AttentionSpec(4, 2, 64), platform) == []
    assert CpuBackend.requirements().platforms == ("cpu",)
