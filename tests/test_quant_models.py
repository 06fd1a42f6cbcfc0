"""Quantized checkpoints in the real fp8 and int8 formats against the same model dequantized.

A tiny random Llama (sizes multiples of 128, so 128x128 fp8 blocks fit its fused q/k/v and
gate/up shards) is written to disk by ``quant_formats`` as each producer writes it, loaded
by hwplug through its quant method, and compared with hwplug running the dequantized
weights unquantized: the logits of a prefill and greedy decode steps (both models fed the
dequantized model's tokens) within :data:`LOGIT_RTOL` of the logits' range, and the
first greedy tokens identical on at least :data:`MIN_SAME_PROMPTS` of :data:`NUM_PROMPTS`
prompts. The vocabulary is small (64) so a random model's top logits are not near-ties.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_harness import InMemoryCheckpoint, greedy_steps
from quant_formats import FORMATS, LINEARS, write_quantized
from tiny_models import randomize
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from hwplug.errors import RemovedError, UnsupportedError
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import Checkpoint

#: Max |quantized logit - dequantized logit| over the dequantized logits' range. Weights
#: are identical after dequantization: what is left is activation quantization (fp8 e4m3
#: keeps 3 mantissa bits per token or group, int8 ~7 bits) and the bf16 of weight-only.
#: Measured (torch 2.13, CPU): 0.069, 0.077, 0.071, 0.035, 0.0095 in this order.
LOGIT_RTOL = {"fp8-block": 0.10, "fp8-channel-token": 0.11, "fp8-tensor-static": 0.10,
              "int8-w8a8": 0.05, "int8-weight-only": 0.015}
#: Prompts (of 32) whose first 3 greedy tokens must be identical: more than half with fp8
#: activations, three quarters with int8. Measured: 22, 18, 21, 26, 28.
MIN_SAME_PROMPTS = {"fp8-block": 17, "fp8-channel-token": 17, "fp8-tensor-static": 17,
                    "int8-w8a8": 24, "int8-weight-only": 24}
NUM_PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 10, 3
CONFIG = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                     max_position_embeddings=64, architectures=["LlamaForCausalLM"])


@pytest.fixture(scope="module")
def reference():
    """The random fp32 model, and each linear's largest input on calibration tokens."""
    model = AutoModelForCausalLM.from_config(CONFIG).eval()
    generator = randomize(model, std=0.08)
    amax: dict[str, float] = {}
    hooks = [module.register_forward_hook(
        lambda mod, args, out, name=name: amax.__setitem__(
            name, max(amax.get(name, 0.0), float(args[0].abs().max()))))
        for name, module in model.named_modules() if name.rpartition(".")[2] in LINEARS]
    with torch.no_grad():
        model(torch.randint(0, CONFIG.vocab_size, (4, 24), generator=generator))
    for hook in hooks:
        hook.remove()
    return model.state_dict(), amax


def load(directory: Path, dtype: str):
    checkpoint = Checkpoint(AutoConfig.from_pretrained(directory), None, directory,
                            "safetensors", (directory / "model.safetensors",))
    return build_model(checkpoint, dtype=dtype, block_size=8)


def against_dequantized(model, ctx, dequantized: dict, dtype: str) -> tuple[float, int]:
    """Run ``model`` and the same model on its ``dequantized`` weights over the same prompts
    (teacher-forced by the latter's tokens): the max logit difference over the dequantized
    logits' range, and how many prompts got identical greedy tokens."""
    want_model, want_ctx = build_model(InMemoryCheckpoint(CONFIG, dequantized), dtype=dtype,
                                       block_size=8)
    prompts = torch.randint(0, CONFIG.vocab_size, (NUM_PROMPTS, PROMPT_LEN),
                            generator=torch.Generator().manual_seed(1))
    want, want_tokens = greedy_steps(want_model, want_ctx, prompts, NEW_TOKENS)
    got, got_tokens = greedy_steps(model, ctx, prompts, NEW_TOKENS, feed=want_tokens)
    error = float((got - want).abs().max() / (want.max() - want.min()))
    return error, int((got_tokens == want_tokens).all(dim=1).sum())


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_quantized_checkpoint_tracks_its_dequantized_weights(reference, fmt, tmp_path):
    state, amax = reference
    dtype = "bfloat16" if fmt == "int8-weight-only" else "float32"
    dequantized = write_quantized(state, CONFIG.to_dict(), fmt, tmp_path, amax)
    model, ctx = load(tmp_path, dtype)
    assert ctx.quant_method.get_name() == ("int8" if fmt.startswith("int8") else "fp8")
    error, same = against_dequantized(model, ctx, dequantized, dtype)
    assert error < LOGIT_RTOL[fmt], error
    assert same >= MIN_SAME_PROMPTS[fmt], (same, NUM_PROMPTS)


def test_weights_stay_quantized_and_dequantize_to_what_was_written(reference, tmp_path):
    state, amax = reference
    dequantized = write_quantized(state, CONFIG.to_dict(), "fp8-block", tmp_path, amax)
    model, ctx = load(tmp_path, "float32")
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn
    assert tuple(qkv.weight_scale_inv.shape) == (4, 2)  # q 256 + k 128 + v 128 rows / 128
    expected = torch.cat([dequantized[f"model.layers.0.self_attn.{p}.weight"]
                          for p in ("q_proj", "k_proj", "v_proj")])
    torch.testing.assert_close(ctx.quant_method.dequantize(qkv), expected, atol=0, rtol=0)


def test_removed_and_unsupported_methods_are_typed_errors(reference, tmp_path, monkeypatch):
    state, amax = reference
    write_quantized(state, CONFIG.to_dict(), "int8-w8a8", tmp_path, amax)
    config = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(config.replace('"compressed-tensors"',
                                                         '"marlin-24"'))
    with pytest.raises(RemovedError, match="quantization method 'marlin-24' was removed; use "
                                           "'int8' instead"):
        load(tmp_path, "float32")
    (tmp_path / "config.json").write_text(config.replace('"int", "symmetric": true',
                                                         '"int", "symmetric": false'))
    with pytest.raises(UnsupportedError, match="asymmetric"):
        load(tmp_path, "float32")
