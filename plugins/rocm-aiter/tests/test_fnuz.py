"""fp8 on AMD gfx942 (MI300), which computes in e4m3fnuz (issue 28): hwplug's
``fp8_e4m3fnuz`` dtype, OCP e4m3 checkpoints converted with their scales doubled (as vLLM
does), and the fp8_e4m3fnuz KV cache, on a fake MI300X tree (HWPLUG_PROBE_ROOT) with the
Triton kernels in Triton's interpreter (conftest.py sets TRITON_INTERPRET=1).
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
from fake_hw import make_amd_tree
from plugin_checks import discovered

from hwplug.config import EngineConfig
from hwplug.conformance import Placement, check_backend, check_quant_method, check_variant
from hwplug.dtypes import FNUZ_FEATURE, dtype_name, is_quantized_kv_cache, torch_dtype
from hwplug.errors import UnsupportedError
from hwplug.kernel_registry import kernels
from hwplug.model_zoo.quant_methods.fnuz import e4m3fn_to_fnuz
from hwplug.model_zoo.quant_methods.scaled import Fp8LinearMethod
from hwplug_rocm_aiter.backends import RocmTritonBackend


@pytest.fixture
def mi300x(tmp_path, monkeypatch, fresh_discovery):
    make_amd_tree(tmp_path, ["AMD Instinct MI300X"], gfx_target_version=90402)
    return discovered(monkeypatch, tmp_path, "rocm")


def test_fnuz_is_a_dtype_of_the_vocabulary():
    assert torch_dtype("fp8_e4m3fnuz") is torch.float8_e4m3fnuz
    assert dtype_name(torch.float8_e4m3fnuz) == "fp8_e4m3fnuz"
    assert is_quantized_kv_cache("fp8_e4m3fnuz")


def test_every_e4m3_byte_keeps_its_value_when_read_as_fnuz_with_the_scale_doubled():
    ocp = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.tensor(0.37)
    fnuz, doubled, input_scale = e4m3fn_to_fnuz(ocp, scale, torch.tensor(0.5))
    assert fnuz.dtype == torch.float8_e4m3fnuz and float(doubled) == pytest.approx(0.74)
    assert float(input_scale) == 1.0
    before, after = ocp.float() * scale, fnuz.float() * doubled
    finite = ~before.isnan()
    assert torch.equal(after[finite], before[finite])  # exactly: one exponent step
    assert not after.isnan().any()  # e4m3fn's -0.0 (0x80) is fnuz's NaN: written as 0


def test_gfx942_offers_fp8_checkpoints_and_the_fnuz_kv_cache(mi300x):
    facts = mi300x.facts
    assert FNUZ_FEATURE in facts.features and "fp8" in facts.supported_quant_methods
    assert "fp8_e4m3fnuz" in facts.supported_kv_cache_dtypes
    assert "fp8_e4m3" not in facts.supported_kv_cache_dtypes
    config = EngineConfig(32, 8, 128, dtype="bfloat16", kv_cache_dtype="fp8_e4m3fnuz")
    mi300x.check_and_update_config(config)
    assert config.attention_backend == "ROCM_TRITON"  # AITER's wrapper takes no fp8 cache
    with pytest.raises(UnsupportedError, match="KV-cache dtype 'fp8_e4m3' is not supported "
                                               "on platform 'rocm'"):
        mi300x.check_and_update_config(
            EngineConfig(32, 8, 128, dtype="bfloat16", kv_cache_dtype="fp8_e4m3"))


def test_an_ocp_fp8_checkpoint_is_converted_and_computed_in_fnuz(mi300x):
    method = Fp8LinearMethod.from_config({"quant_method": "fp8"})
    layer = torch.nn.Module()
    method.create_weights(layer, 64, 32, torch.float32, bias=False)
    rng = torch.Generator().manual_seed(0)
    ocp = (torch.randn(32, 64, generator=rng) * 3).to(torch.float8_e4m3fn)
    with torch.no_grad():
        layer.weight.copy_(ocp)
        layer.weight_scale.fill_(0.02)
    scale = layer.weight_scale[0].item()  # 0.02 in float32
    method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float8_e4m3fnuz and float(layer.scale_b) == 2 * scale
    expected_weight = ocp.float() * scale
    assert torch.equal(method.dequantize(layer), expected_weight)
    x = torch.randn(5, 64, generator=rng)
    out = method.apply(layer, x)
    reference = x @ expected_weight.T
    assert (out - reference).abs().max() < 0.05 * reference.abs().max()  # fp8 activations
    assert "triton_rocm_fnuz" in kernels.op("scaled_mm").variants_used()


def test_the_kit_passes_the_fp8_method_on_gfx942(mi300x):
    result = check_quant_method(Fp8LinearMethod, Placement("cpu", mi300x), examples=4)
    assert result.status == "simulated" and result.simulation == "Triton interpreter", result


def test_the_fnuz_triton_gemm_matches_the_reference_in_the_interpreter(mi300x):
    result = check_variant("scaled_mm/triton_rocm_fnuz", Placement("cpu", mi300x),
                           examples=8)
    assert result.status == "simulated", result.detail
    assert "fp8_e4m3fnuz" in result.detail


class _FnuzCacheOnly(RocmTritonBackend):
    """ROCM_TRITON restricted to fnuz caches, so every drawn example uses one (fp32 / fp16
    queries: the interpreter cannot judge bf16 dots)."""

    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("fp8_e4m3fnuz",)


def test_the_fnuz_kv_cache_through_rocm_triton_matches_the_reference(mi300x):
    for result in check_backend(_FnuzCacheOnly, Placement("cpu", mi300x), 2):
        if result.check.endswith("validate refuses unclaimed features"):
            continue
        assert result.status in ("simulated", "skipped"), (result.check, result.detail)
    used = kernels.op("paged_attention").variants_used()
    assert "triton_rocm_pa" in used, used
