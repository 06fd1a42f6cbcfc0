"""Writing a checkpoint's linear weights in the real quantized formats, as producers do.

:func:`write_quantized` takes a float32 Llama state dict and writes a model directory
(``config.json`` with the format's ``quantization_config``, ``model.safetensors`` with the
tensor names and dtypes the producer uses), and returns the state dict of the same model
with every quantized weight dequantized: the reference the quantized model is compared to.

Formats: HF fine-grained fp8 (``quant_method: fp8``, 128x128 ``weight_scale_inv``, as
transformers and DeepSeek-V3 write it), and compressed-tensors (llm-compressor) fp8
per-tensor with static input scales, fp8 per-channel with dynamic per-token activations,
int8 W8A8 (per-channel weights, dynamic per-token activations) and int8 weight-only; and,
in :data:`INT4_FORMATS`, compressed-tensors ``pack-quantized`` int4 weight-only (W4A16, as
llm-compressor writes it: ``weight_packed`` int32, ``weight_scale``, ``weight_shape``),
per group of 128 inputs and per channel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def _fp8_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax() / FP8_MAX
    return (w / scale).to(FP8), scale.reshape(1)


def _fp8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
    return (w / scale).to(FP8), scale


def _fp8_block(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    tiles = w.view(rows // block, block, cols // block, block)
    scale = tiles.abs().amax(dim=(1, 3)) / FP8_MAX  # [rows / 128, cols / 128]
    values = (tiles / scale[:, None, :, None]).view(rows, cols)
    return values.to(FP8), scale


def _int8_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    return (w / scale).round().clamp(-128, 127).to(torch.int8), scale


def _int4_groups(w: torch.Tensor, group: int | None = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int4 per group of ``group`` inputs (None: the whole row), scale ``amax /
    7.5`` as llm-compressor's min-max observer sets it; values in -8..7."""
    rows, cols = w.shape
    groups = w.view(rows, cols // (group or cols), -1)
    scale = groups.abs().amax(dim=-1) / 7.5  # [rows, cols / group]
    values = (groups / scale[..., None]).round().clamp(-8, 7).to(torch.int8)
    return values.view(rows, cols), scale


def pack_int32(values: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' ``pack_to_int32``: eight values + 8 per int32, the first lowest."""
    codes = (values.to(torch.int64) + 8).view(values.shape[0], -1, 8)
    packed = (codes << (4 * torch.arange(8))).sum(dim=-1)  # in [0, 2**32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _dequantized(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if scale.dim() == 2 and (scale.shape[1] > 1 or scale.shape[0] != values.shape[0]):  # blocks
        rows, cols = values.shape
        tiles = values.float().view(scale.shape[0], rows // scale.shape[0], scale.shape[1], -1)
        return (tiles * scale[:, None, :, None]).view(rows, cols)
    return values.float() * scale


def _group(weights: dict, activations: dict | None) -> dict:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    return {"quant_method": "compressed-tensors", "format": "float-quantized"
            if weights["type"] == "float" else "int-quantized",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"]}


_FP8_W = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False}
_INT8_W = {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": False,
           "strategy": "channel"}
#: name -> (quantizer, scale tensor name, quantization_config, static input scales)
FORMATS: dict[str, tuple[Callable, str, dict, bool]] = {
    "fp8-block": (_fp8_block, "weight_scale_inv",
                  {"quant_method": "fp8", "activation_scheme": "dynamic",
                   "weight_block_size": [128, 128]}, False),
    "fp8-tensor-static": (_fp8_tensor, "weight_scale", _group(
        {**_FP8_W, "strategy": "tensor"},
        {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}), True),
    "fp8-channel-token": (_fp8_channel, "weight_scale", _group(
        {**_FP8_W, "strategy": "channel"},
        {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}), False),
    "int8-w8a8": (_int8_channel, "weight_scale", _group(
        _INT8_W, {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}), False),
    "int8-weight-only": (_int8_channel, "weight_scale", _group(_INT8_W, None), False),
}


_INT4_W = {"num_bits": 4, "type": "int", "symmetric": True, "dynamic": False,
           "actorder": None, "observer": "minmax"}
PACKED = {"format": "pack-quantized"}
#: name -> as in FORMATS: llm-compressor's W4A16 pack-quantized checkpoints.
INT4_FORMATS: dict[str, tuple[Callable, str, dict, bool]] = {
    "int4-w4a16-group128": (_int4_groups, "weight_scale", {**_group(
        {**_INT4_W, "strategy": "group", "group_size": 128}, None), **PACKED}, False),
    "int4-w4a16-channel": (lambda w: _int4_groups(w, None), "weight_scale", {**_group(
        {**_INT4_W, "strategy": "channel"}, None), **PACKED}, False),
}


def write_quantized(state: dict[str, torch.Tensor], config: dict, fmt: str, out: Path,
                    input_amax: dict[str, float]) -> dict[str, torch.Tensor]:
    """Write ``state`` (a float32 Llama state dict, ``config`` its ``config.json`` dict) in
    format ``fmt`` under ``out``; return the dequantized state dict. ``input_amax`` gives
    each linear module's largest input magnitude (calibration), for static input scales."""
    quantizer, scale_name, quant_config, static = {**FORMATS, **INT4_FORMATS}[fmt]
    written, dequantized = {}, {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rpartition(".")[2] in LINEARS:
            values, scale = quantizer(tensor.float())
            written[f"{module}.{scale_name}"] = scale.float()
            if quant_config.get("format") == PACKED["format"]:
                written[f"{module}.weight_packed"] = pack_int32(values)
                written[f"{module}.weight_shape"] = torch.tensor(values.shape)
            else:
                written[name] = values
            if static:
                written[f"{module}.input_scale"] = torch.tensor([input_amax[module] / FP8_MAX])
            dequantized[name] = _dequantized(values, scale)
        else:
            written[name] = dequantized[name] = tensor.float()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**config, "quantization_config":
                                                 quant_config}))
    save_file({k: v.contiguous() for k, v in written.items()}, out / "model.safetensors")
    return dequantized
