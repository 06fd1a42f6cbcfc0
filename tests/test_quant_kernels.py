"""Quantization pieces against their references: the scale descriptor, checkpoint formats,
activation quantization, every ``scaled_mm`` scale granularity and the CPU int8 variants,
and the gates that refuse a method a platform cannot run."""

from __future__ import annotations

import pytest
import torch

from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry.reference.matmul import scaled_mm
from hwplug.model_zoo.quant_methods import quant_method_for
from hwplug.model_zoo.quant_methods.activations import quantize
from hwplug.model_zoo.quant_methods.formats import (
    compressed_tensors_scheme,
    fp8_scheme,
    method_name,
)
from hwplug.platform_interface import Platform
from hwplug.platforms.cpu import int8
from hwplug.quantization import ScaleDescriptor

GEN = torch.Generator().manual_seed(0)


def test_scale_descriptor_states_and_validates_its_granularity():
    assert str(ScaleDescriptor("fp8_e4m3", "block", group_shape=(128, 128))) == (
        "fp8_e4m3 per-block 128x128 (static)")
    with pytest.raises(ConfigError, match="choose one of: tensor, channel, token, group, block"):
        ScaleDescriptor("int8", "row")
    with pytest.raises(ConfigError, match="group scales need a positive group_shape"):
        ScaleDescriptor("int8", "group")
    with pytest.raises(ConfigError, match="channel scales take no group_shape"):
        ScaleDescriptor("int8", "channel", group_shape=(1, 8))


def test_checkpoint_formats_name_their_method_and_scheme():
    block = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    assert method_name(block) == "fp8" and method_name(None) == "unquantized"
    scheme = fp8_scheme(block)
    assert (str(scheme.weight), str(scheme.activation), scheme.weight_scale_name) == (
        "fp8_e4m3 per-block 128x128 (static)", "fp8_e4m3 per-group 1x128 (dynamic)",
        "weight_scale_inv")
    int8 = {"quant_method": "compressed-tensors", "config_groups": {"g": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
        "input_activations": None}}}
    assert method_name(int8) == "int8" and compressed_tensors_scheme(int8).activation is None
    int4 = {**int8, "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}
    assert method_name(int4) == "int4"
    int2 = {**int8, "config_groups": {"g": {"targets": ["Linear"], "weights": {
        "num_bits": 2, "type": "int", "strategy": "group", "group_size": 128}}}}
    with pytest.raises(UnsupportedError, match="2-bit int is not supported; supported: 8-bit"):
        method_name(int2)
    with pytest.raises(UnsupportedError, match="leave \\['model.layers.0.mlp'\\] unquantized"):
        compressed_tensors_scheme({**int8, "ignore": ["lm_head", "model.layers.0.mlp"]})


@pytest.mark.parametrize("descriptor", [
    ScaleDescriptor("fp8_e4m3", "tensor", dynamic=True),
    ScaleDescriptor("fp8_e4m3", "token", dynamic=True),
    ScaleDescriptor("fp8_e4m3", "group", dynamic=True, group_shape=(1, 50)),
    ScaleDescriptor("int8", "token", dynamic=True),
], ids=str)
def test_quantized_activations_dequantize_to_the_input_within_the_formats_resolution(
        descriptor):
    x = torch.randn(5, 100, generator=GEN) * torch.tensor([10.0, 1, 1, 0.1, 0])[:, None]
    values, scale = quantize(x, descriptor)
    back = scaled_mm(values, torch.eye(100), scale, torch.ones(()), torch.float32)
    resolution = 2 ** -3 if descriptor.dtype.startswith("fp8") else 1 / 127
    assert torch.all((back - x).abs() <= resolution * x.abs().amax(dim=-1, keepdim=True) + 1e-12)
    assert not torch.isnan(back).any()  # the all-zero row


def test_a_static_scale_is_required_when_not_dynamic():
    with pytest.raises(UnsupportedError, match="needs a static scale from the checkpoint"):
        quantize(torch.ones(2, 4), ScaleDescriptor("fp8_e4m3", "tensor"))


def test_block_and_group_scales_apply_block_by_block():
    a, b = torch.randn(3, 12, generator=GEN), torch.randn(12, 8, generator=GEN)
    scale_a, scale_b = torch.rand(3, 3, generator=GEN), torch.rand(3, 2, generator=GEN)
    expected = torch.zeros(3, 8)
    for i in range(3):
        for j in range(8):
            for k in range(12):  # groups of 4 inputs; blocks of 4 x 4
                expected[i, j] += (a[i, k] * scale_a[i, k // 4]) * (b[k, j] * scale_b[k // 4,
                                                                                     j // 4])
    torch.testing.assert_close(scaled_mm(a, b, scale_a, scale_b, torch.float32), expected)
    with pytest.raises(UnsupportedError, match="5 scales do not split dimension 1 of size 12"):
        scaled_mm(a, b, torch.rand(3, 5), scale_b, torch.float32)


@pytest.mark.parametrize("scale_a_shape, scale_b_shape", [((), ()), ((4, 1), (1, 24))],
                         ids=["per-tensor", "per-token-and-channel"])
def test_int_mm_variant_matches_the_reference(scale_a_shape, scale_b_shape):
    a = torch.randint(-127, 128, (4, 64), generator=GEN, dtype=torch.int8)
    b = torch.randint(-127, 128, (24, 64), generator=GEN, dtype=torch.int8).t()
    scale_a, scale_b = torch.rand(scale_a_shape) + 0.5, torch.rand(scale_b_shape) * 0.01
    bias = torch.randn(24, generator=GEN)
    assert int8.int_mm_supported(a, b, scale_a, scale_b, torch.float32, bias) is None
    torch.testing.assert_close(int8.int_mm(a, b, scale_a, scale_b, torch.float32, bias),
                               scaled_mm(a, b, scale_a, scale_b, torch.float32, bias),
                               atol=1e-4, rtol=1e-4)
    assert "scales must be one value or [1, 24]" in int8.int_mm_supported(
        a, b, scale_a, torch.ones(2, 24), torch.float32)


def test_weight_only_variant_matches_the_reference_in_bf16():
    x = torch.randn(5, 64, generator=GEN).bfloat16()
    weight = torch.randint(-127, 128, (24, 64), generator=GEN, dtype=torch.int8)
    scale_b, one = torch.rand(1, 24, generator=GEN) * 0.01, torch.ones(())
    assert int8.weight_only_supported(x, weight.t(), one, scale_b, torch.bfloat16) is None
    torch.testing.assert_close(int8.weight_only(x, weight.t(), one, scale_b, torch.bfloat16),
                               scaled_mm(x, weight.t(), one, scale_b, torch.bfloat16),
                               atol=2e-2, rtol=2e-2)
    reasons = (int8.weight_only_supported(x, weight.t().contiguous(), one, scale_b,
                                          torch.bfloat16),
               int8.weight_only_supported(x, weight.t(), torch.ones(5, 1), scale_b,
                                          torch.bfloat16))
    assert reasons == ("needs the weight [N, K] contiguous (b = weight.T)",
                       "activations are not quantized: scale_a must be one value")


class OnlyUnquantized(Platform):
    name = "bare"
    supported_dtypes = ("float32",)
    supported_quant_methods = ("unquantized",)


def test_a_platform_refuses_a_method_it_does_not_list(fresh_discovery):
    fresh_discovery.current_platform()  # registers the methods
    with pytest.raises(UnsupportedError, match="quantization 'fp8' cannot run on platform "
                                               "'bare' .*: the platform allows only "
                                               "unquantized; methods it runs: unquantized"):
        quant_method_for({"quant_method": "fp8"}, OnlyUnquantized(), "float32")
    method = quant_method_for({"quant_method": "fp8"}, fresh_discovery.current_platform(),
                              "float32")  # the CPU runs fp8 with the reference GEMM
    assert method.get_name() == "fp8"
