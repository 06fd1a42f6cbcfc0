"""int4 weights: the ``int4_linear`` op's layout and reference, and the ``int4`` quant method
reading llm-compressor's compressed-tensors ``pack-quantized`` (W4A16) checkpoints.

Checkpoints are written by ``quant_formats`` as llm-compressor writes them and compared
with the same model running the dequantized weights unquantized. On this x86 host the
op's reference serves the GEMM; on a fake Arm host (simulated at the probe boundary)
hwplug-cpu-arm's KleidiAI variant does, through torch's portable path of the same ops.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from fake_hw import ArmCore, arm_cpuinfo
from plugin_checks import discovered
from quant_formats import INT4_FORMATS, pack_int32, write_quantized
from safetensors.torch import load_file, save_file

# the random fp32 Llama those tests quantize, its harness, and its `reference` fixture
from test_quant_models import (  # noqa: F401
    CONFIG,
    NUM_PROMPTS,
    against_dequantized,
    load,
    reference,
)
from tiny_checkpoints import WEIGHTS, write_tiny_llama

from hwplug import LLM, SamplingParams
from hwplug.conformance import check_quant_method
from hwplug.conformance.quant_inputs import random_int4
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry.ops_int4 import int4_linear
from hwplug.kernel_registry.reference.int4 import (
    dequantize_int4,
    group_size,
    pack_int4,
    unpack_int4,
)
from hwplug.model_zoo.context import quantization_report
from hwplug.model_zoo.quant_methods.formats import method_name
from hwplug.model_zoo.quant_methods.int4 import Int4LinearMethod

W4A16 = INT4_FORMATS["int4-w4a16-group128"][2]
#: Max |int4 logit - dequantized logit| over the dequantized logits' range, by (format,
#: platform). The weights are identical after dequantization: on ``cpu`` only the summation
#: order differs in fp32, and in bf16 the dequantized model's weights are rounded to bf16
#: while the reference dequantizes to fp32; KleidiAI also rounds activations to int8 per
#: row (and, per group, scales to bf16). Measured (torch 2.13, this CPU): 8.2e-7 and 0.0092
#: (bf16) on cpu, 0.026 and 0.025 (bf16) on cpu-arm.
LOGIT_RTOL = {("int4-w4a16-group128", "cpu"): 1e-5, ("int4-w4a16-channel", "cpu"): 0.015,
              ("int4-w4a16-group128", "cpu-arm"): 0.04, ("int4-w4a16-channel", "cpu-arm"): 0.04}
#: Prompts (of 32) whose first 3 greedy tokens must be identical. Measured: 32 and 29 on
#: cpu, 27 and 29 on cpu-arm.
MIN_SAME_PROMPTS = {"cpu": 28, "cpu-arm": 24}
#: Model dtype of each format's test: bf16 activations need per-row scales on KleidiAI.
DTYPE = {"int4-w4a16-group128": "float32", "int4-w4a16-channel": "bfloat16"}


def config(**weights) -> dict:
    """llm-compressor's W4A16 config with ``weights`` changed."""
    changed = copy.deepcopy(W4A16)
    changed["config_groups"]["group_0"]["weights"].update(weights)
    return changed


# --- the layout ---------------------------------------------------------------------------


def test_codes_are_read_low_nibble_first_with_an_offset_of_8():
    qweight = torch.tensor([[0x2F, 0x80]], dtype=torch.uint8)  # codes 15, 2, 0, 8
    scales = torch.tensor([[0.5, 2.0]])  # groups of 2
    assert unpack_int4(qweight).tolist() == [[7, -6, -8, 0]]
    assert dequantize_int4(qweight, scales).tolist() == [[3.5, -3.0, -16.0, 0.0]]
    assert pack_int4(unpack_int4(qweight)).equal(qweight)


def test_compressed_tensors_int32_packing_read_as_bytes_is_the_op_layout():
    values = torch.randint(-8, 8, (6, 64), generator=torch.Generator().manual_seed(0))
    assert pack_int32(values).view(torch.uint8).equal(pack_int4(values))


def test_reference_is_dequantize_then_linear_in_the_input_dtype():
    qweight, scales = random_int4(torch.Generator().manual_seed(1), 24, 64, 32)
    x, bias = torch.randn(2, 3, 64).bfloat16(), torch.randn(24)
    out = int4_linear.reference(x, qweight, scales, bias)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 24)
    torch.testing.assert_close(out, F.linear(x.float(), dequantize_int4(qweight, scales),
                                             bias).bfloat16())


def test_bad_int4_tensors_are_typed_errors():
    qweight = torch.zeros(4, 32, dtype=torch.uint8)
    with pytest.raises(UnsupportedError, match=r"do not split 64 inputs into equal groups"):
        group_size(64, torch.ones(4, 3))
    with pytest.raises(UnsupportedError, match="int4 weights are uint8"):
        unpack_int4(qweight.to(torch.int32))
    with pytest.raises(UnsupportedError, match="values in -8..7"):
        pack_int4(torch.tensor([[8, 0]]))
    with pytest.raises(UnsupportedError, match="x has 32 inputs, the int4 weight 64"):
        int4_linear.reference(torch.randn(1, 32), qweight, torch.ones(4, 2))


# --- the quant method ---------------------------------------------------------------------


def test_llm_compressor_w4a16_configs_select_the_int4_method():
    assert method_name(W4A16) == "int4"
    assert Int4LinearMethod.from_config(W4A16).describe().startswith(
        "int4 (weights int4 per-group 1x128 (static)")
    channel = Int4LinearMethod.from_config(INT4_FORMATS["int4-w4a16-channel"][2])
    assert channel.scheme.weight.granularity == "channel"
    assert Int4LinearMethod.from_config(config(actorder="weight")).scheme == \
        Int4LinearMethod.from_config(W4A16).scheme  # only the quantization order differed
    assert Int4LinearMethod.from_config({"quant_method": "int4"}).scheme.weight.group_shape \
        == (1, 128)


@pytest.mark.parametrize(("bad", "error", "message"), [
    (config(symmetric=False), UnsupportedError, "asymmetric .* not supported"),
    (config(actorder="group"), UnsupportedError,
     r"actorder 'group' \(columns permuted by weight_g_idx\) is not supported; supported: "
     r"null, 'weight'"),
    (config(strategy="tensor"), UnsupportedError, "supported strategies: group, channel"),
    (config(num_bits=3), UnsupportedError, "3-bit int is not supported; supported: 8-bit "
                                           "float"),
    ({**W4A16, "format": "int-quantized"}, UnsupportedError,
     "format 'int-quantized' is not supported for int4 weights; supported: 'pack-quantized'"),
    ({**W4A16, "config_groups": {"group_0": {
        **W4A16["config_groups"]["group_0"], "input_activations": {
            "num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}},
     UnsupportedError, "supported: weight-only"),
    ({"quant_method": "gptq", "bits": 4}, UnsupportedError, "reads compressed-tensors"),
])
def test_unsupported_configs_are_typed_errors_naming_what_is_supported(bad, error, message):
    with pytest.raises(error, match=message):
        Int4LinearMethod.from_config(bad)


def test_a_layer_whose_inputs_do_not_split_into_groups_is_refused():
    with pytest.raises(ConfigError, match="multiple of 8 and of the group size 128; this "
                                          "layer has 96"):
        Int4LinearMethod.from_config(W4A16).create_weights(torch.nn.Module(), 96, 16,
                                                           torch.float32, False)


def test_apply_is_dequantize_then_linear(fresh_discovery):
    method = Int4LinearMethod.from_config(config(group_size=32))
    layer = torch.nn.Module()
    method.create_weights(layer, 64, 40, torch.float32, True)
    generator = torch.Generator().manual_seed(2)
    values = torch.randint(-8, 8, (40, 64), generator=generator)
    with torch.no_grad():
        layer.weight_packed.copy_(pack_int32(values))
        layer.weight_scale.copy_(torch.rand(40, 2, generator=generator) + 0.5)
        layer.bias.copy_(torch.randn(40, generator=generator))
    method.process_weights_after_loading(layer)
    weight = values.float() * layer.weight_scale.repeat_interleave(32, dim=1)
    torch.testing.assert_close(method.dequantize(layer), weight, atol=0, rtol=0)
    x = torch.randn(3, 64, generator=generator)
    torch.testing.assert_close(method.apply(layer, x), F.linear(x, weight, layer.bias))


def arm_host(tmp_path, monkeypatch):
    arm_cpuinfo(tmp_path, [ArmCore()] * 2)
    return discovered(monkeypatch, tmp_path, "cpu-arm")


@pytest.mark.parametrize("platform", ["cpu", "cpu-arm"])
def test_conformance_kit_passes_the_method(platform, tmp_path, monkeypatch, fresh_discovery):
    if platform == "cpu-arm":
        arm_host(tmp_path, monkeypatch)
    result = check_quant_method(Int4LinearMethod)
    assert result.status == "passed", result.detail
    used = int4_linear.variants_used()
    assert ("kleidiai" in used) == (platform == "cpu-arm"), used


# --- whole models -------------------------------------------------------------------------


@pytest.mark.parametrize("platform", ["cpu", "cpu-arm"])
@pytest.mark.parametrize("fmt", sorted(INT4_FORMATS))
def test_an_int4_checkpoint_tracks_its_dequantized_weights(reference, fmt, platform,  # noqa: F811
                                                           tmp_path, monkeypatch,
                                                           fresh_discovery):
    if platform == "cpu-arm":
        arm_host(tmp_path / "arm", monkeypatch)
    state, _ = reference
    dtype = DTYPE[fmt]
    dequantized = write_quantized(state, CONFIG.to_dict(), fmt, tmp_path, {})
    model, ctx = load(tmp_path, dtype)
    assert ctx.quant_method.get_name() == "int4"
    assert model.model.layers[0].mlp.down_proj.weight_packed.dtype == torch.int32
    error, same = against_dequantized(model, ctx, dequantized, dtype)
    served = ("kleidiai_bf16" if dtype == "bfloat16" else "kleidiai") \
        if platform == "cpu-arm" else "reference"
    assert int4_linear.variants_used() == {served}
    assert f"int4_linear served by {served}" in quantization_report(ctx)
    assert error < LOGIT_RTOL[fmt, platform], error
    assert same >= MIN_SAME_PROMPTS[platform], (same, NUM_PROMPTS)


def test_llm_generates_the_tokens_of_the_dequantized_weights(tmp_path):
    quantized, plain = tmp_path / "int4", tmp_path / "plain"
    for directory in (quantized, plain):
        write_tiny_llama(directory, hidden_size=256, intermediate_size=512)
    hf_config = json.loads((quantized / "config.json").read_text())
    dequantized = write_quantized(load_file(quantized / WEIGHTS), hf_config,
                                  "int4-w4a16-group128", quantized, {})
    save_file(dequantized, plain / WEIGHTS)
    prompts = [[3, 4, 5, 6], [7, 8], [9] * 5]
    sampling = SamplingParams(max_tokens=6, ignore_eos=True)
    tokens = {name: [out.outputs[0].token_ids for out in
                     LLM(str(directory), dtype="float32").generate(prompts, sampling)]
              for name, directory in (("int4", quantized), ("plain", plain))}
    assert tokens["int4"] == tokens["plain"]
    assert all(len(ids) == 6 for ids in tokens["int4"])
