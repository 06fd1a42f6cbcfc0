"""Dispatch semantics of the kernel registry: ranking, fallbacks, policy, caching."""

from __future__ import annotations

import logging

import pytest
import torch
from toy_ops import double, tagged, toy_registry

from hwplug.errors import ConfigError, DuplicateNameError, UnknownNameError, UnsupportedError
from hwplug.kernel_registry import KernelRegistry, kernels
from hwplug.platforms.cpu.platform import CpuPlatform


@pytest.fixture
def reg(fresh_discovery) -> KernelRegistry:
    return toy_registry()


def test_reference_serves_when_nothing_else_is_registered(reg):
    x = torch.ones(3)
    assert torch.equal(reg.op("double")(x), x * 2)
    assert reg.explain("double", CpuPlatform(), "cpu", "float32").chosen.name == "reference"


def test_priority_orders_variants(reg):
    reg.register_variant("double", "low", tagged(1.0), priority=1)
    reg.register_variant("double", "high", tagged(7.0), priority=9)
    assert reg.op("double")(torch.zeros(2)).tolist() == [7.0, 7.0]


def test_supports_rejection_falls_back_and_logs_once(reg, caplog):
    reg.register_variant("double", "even_only", tagged(5.0), priority=9,
                         supports=lambda x: None if x.shape[0] % 2 == 0 else "odd length")
    op = reg.op("double")
    assert op(torch.zeros(4)).tolist() == [5.0] * 4
    with caplog.at_level(logging.INFO, logger="hwplug.kernel_registry.plan"):
        assert op(torch.ones(3)).tolist() == [2.0] * 3
        op(torch.ones(5))
    fallbacks = [r for r in caplog.records if "falling back to reference" in r.message]
    assert len(fallbacks) == 1 and "odd length" in fallbacks[0].message


def test_variants_used_names_what_served_calls(reg):
    reg.register_variant("double", "even_only", tagged(5.0), priority=9,
                         supports=lambda x: None if x.shape[0] % 2 == 0 else "odd length")
    op = reg.op("double")
    assert op.variants_used() == set()
    op(torch.zeros(4))
    assert op.variants_used() == {"even_only"}
    op(torch.zeros(3))
    assert op.variants_used() == {"even_only", "reference"}
    op(torch.zeros(2, dtype=torch.float64))  # a new key, served by its first choice
    reg.register_variant("double", "other", tagged(1.0))
    assert op.variants_used() == set()


def test_static_facts_reject_with_reasons(reg):
    reg.register_variant("double", "gpu_only", tagged(3.0), platforms=("cuda",), priority=9)
    reg.register_variant("double", "bf16_only", tagged(3.0), dtypes=("bfloat16",), priority=8)
    reg.register_variant("double", "needs_sm90", tagged(3.0), min_capability="9.0", priority=7)
    reg.register_variant("double", "needs_toolkit", tagged(3.0), min_toolkit="12.4", priority=6)
    reg.register_variant("double", "needs_pkg", tagged(3.0), packages={"no-such-pkg": ">=1"},
                         priority=5)
    reg.register_variant("double", "broken_import", "no_such_module:fn", priority=4)
    why = reg.explain("double", CpuPlatform(), "cpu", "float32")
    assert why.chosen.name == "reference"
    assert why.rejected["gpu_only"] == "serves platform cuda, not cpu"
    assert why.rejected["bf16_only"] == "dtype float32 not in bfloat16"
    assert why.rejected["needs_sm90"].startswith("needs a device capability")
    assert why.rejected["needs_toolkit"] == "toolkit absent below 12.4"
    assert "no-such-pkg not installed" in why.rejected["needs_pkg"]
    assert "import failed" in why.rejected["broken_import"]


def test_disabled_kernels_by_full_or_short_name(reg, monkeypatch):
    reg.register_variant("double", "fast", tagged(9.0), priority=9)
    op = reg.op("double")
    assert op(torch.zeros(1)).item() == 9.0
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "double/fast")
    op.invalidate()
    assert op(torch.ones(1)).item() == 2.0
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "fast")
    why = reg.explain("double", CpuPlatform(), "cpu", "float32")
    assert why.rejected["fast"] == "disabled by HWPLUG_DISABLED_KERNELS"


def test_disabling_an_unknown_variant_lists_known(reg, monkeypatch):
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "nope")
    with pytest.raises(ConfigError, match="unknown kernel variants: nope; known: double/reference"):
        reg.explain("double", CpuPlatform(), "cpu", "float32")


def test_prefer_and_strict_policies(reg, monkeypatch):
    reg.register_variant("double", "a", tagged(1.0), priority=9,
                         supports=lambda x: "never" if x.numel() > 1 else None)
    reg.register_variant("double", "b", tagged(2.0), priority=1)
    monkeypatch.setenv("HWPLUG_PREFERRED_KERNELS", "double=b")
    assert reg.explain("double", CpuPlatform(), "cpu", "float32").chosen.name == "b"
    monkeypatch.delenv("HWPLUG_PREFERRED_KERNELS")
    monkeypatch.setenv("HWPLUG_STRICT_KERNELS", "1")
    reg.op("double").invalidate()
    with pytest.raises(UnsupportedError, match="a: never"):
        reg.op("double")(torch.zeros(3))


def test_cache_is_invalidated_by_registration(reg):
    op = reg.op("double")
    assert op(torch.ones(1)).item() == 2.0
    reg.register_variant("double", "late", tagged(4.0), priority=9)
    assert op(torch.ones(1)).item() == 4.0
    reg.drop_source("code")
    with pytest.raises(UnsupportedError, match="no variant of double"):
        op(torch.ones(1))


def test_num_tokens_buckets_pick_per_range(reg):
    reg.register_variant("double", "small", tagged(1.0), priority=9, num_tokens=(0, 16))
    reg.register_variant("double", "large", tagged(3.0), priority=9, num_tokens=(16, None))
    op = reg.op("double")
    assert op(torch.zeros(15)).unique().tolist() == [1.0]
    assert op(torch.zeros(16)).unique().tolist() == [3.0]
    assert op(torch.zeros(400)).unique().tolist() == [3.0]


def test_decorator_registration_and_errors(reg):
    @reg.variant("double", priority=3)
    def decorated(x):
        return x + x

    assert "double/decorated" in reg.names()
    with pytest.raises(DuplicateNameError, match="already registered"):
        reg.register_variant("double", "decorated", double)
    with pytest.raises(UnknownNameError, match="unknown op 'triple'; registered: double"):
        reg.register_variant("triple", "x", double)


def test_global_ops_dispatch_to_reference_on_cpu(fresh_discovery):
    x = torch.randn(4, 8)
    gate = torch.randn(4, 8)
    out = kernels.op("silu_and_mul")(torch.cat([x, gate], -1))
    torch.testing.assert_close(out, torch.nn.functional.silu(x) * gate)


def test_lazy_supports_is_imported_with_the_variant(reg, tmp_path, monkeypatch):
    (tmp_path / "lazy_checks.py").write_text(
        "def small_only(x):\n"
        "    return None if x.numel() <= 4 else f'{x.numel()} elements > 4'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.register_variant("double", "small", tagged(7.0), priority=5,
                         supports="lazy_checks:small_only")
    assert torch.equal(reg.op("double")(torch.ones(2)), torch.full((2,), 7.0))
    assert torch.equal(reg.op("double")(torch.ones(6)), torch.full((6,), 2.0))
    assert callable(reg.get("double/small").supports)
