"""The built-in cpu platform's ``linear/onednn_packed`` variant against the reference op."""

from __future__ import annotations

import pytest
import torch

from hwplug.discovery import current_platform
from hwplug.kernel_registry import kernels, ops, reference


def explain_linear(dtype: str):
    return kernels.explain("linear", current_platform(), "cpu", dtype)


def assert_matches_reference(x, weight, bias=None):
    atol, rtol = ops.linear.tolerances[str(x.dtype).removeprefix("torch.")]
    torch.testing.assert_close(ops.linear(x, weight, bias), reference.linear(x, weight, bias),
                               atol=atol, rtol=rtol)


def test_fp32_linear_on_cpu_chooses_onednn(fresh_discovery):
    assert explain_linear("float32").chosen.name == "onednn_packed"
    assert "dtype bfloat16" in explain_linear("bfloat16").rejected["onednn_packed"]


@pytest.mark.parametrize("leading", [(1,), (7,), (2, 5)], ids=str)
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_onednn_linear_matches_reference(fresh_discovery, leading, with_bias):
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 200, generator=gen) / 14
    bias = torch.randn(96, generator=gen) if with_bias else None
    assert_matches_reference(torch.randn(*leading, 200, generator=gen), weight, bias)


def test_a_weight_written_in_place_is_repacked(fresh_discovery):
    gen = torch.Generator().manual_seed(1)
    x, weight = torch.randn(3, 64, generator=gen), torch.randn(32, 64, generator=gen)
    assert_matches_reference(x, weight)
    with torch.no_grad():
        weight.mul_(-2.0)
    assert_matches_reference(x, weight)


def test_disabling_onednn_falls_back_to_reference(fresh_discovery, monkeypatch):
    monkeypatch.setenv("HWPLUG_DISABLED_KERNELS", "onednn_packed")
    why = explain_linear("float32")
    assert why.chosen.name == "reference"
    assert why.rejected["onednn_packed"] == "disabled by HWPLUG_DISABLED_KERNELS"
