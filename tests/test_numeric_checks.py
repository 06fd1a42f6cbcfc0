"""Numbers a checkpoint or config gives are checked at load (issue 29, item 5).

A NaN or infinite scale (an fp8 KV scale, an fp8 block scale, a GGUF block's fp16 scale)
would turn every logit it reaches NaN, and a KV scale of 0 or below divides by it: each is
a ModelError naming the tensor. ``rope_theta`` must be a finite number above 0. KV scales
calculated from a first batch that is all zero are not frozen at the float minimum: they
come from the first batch that has a range, with a floor of ``1 / fp8 max``.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
from model_harness import InMemoryCheckpoint, PagedBatch
from quant_formats import write_quantized
from safetensors.torch import load_file
from tiny_checkpoints import edit_tensors, shrink_gguf
from tiny_models import random_weights
from transformers import AutoConfig, LlamaConfig

from hwplug.errors import ModelError
from hwplug.kernel_registry.reference.ggml import SCALE_FIELDS
from hwplug.model_zoo.context import build_model
from hwplug.model_zoo.loaders import Checkpoint, load_checkpoint, resolve_model

TINY = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                   max_position_embeddings=64, architectures=["LlamaForCausalLM"])
#: Sizes that are whole 128 x 128 blocks, for fp8 block-scaled weights.
FP8_BLOCKS = LlamaConfig(**{**TINY.to_dict(), "hidden_size": 256, "intermediate_size": 512,
                                     "head_dim": 64})
NOT_FINITE = [math.nan, math.inf, -math.inf]
Q = GGMLQuantizationType


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return random_weights(TINY)


def build(state, config=TINY, **options):
    return build_model(InMemoryCheckpoint(config, state), dtype="float32", block_size=8,
                       **options)


@pytest.mark.parametrize("value", [*NOT_FINITE, 0.0, -0.25])
@pytest.mark.parametrize("name", ["k_scale", "v_proj.output_scale"])
def test_a_kv_scale_that_is_not_finite_and_positive_is_refused_naming_it(state, name, value):
    tensor = f"model.layers.1.self_attn.{name}"
    with pytest.raises(ModelError, match=rf"checkpoint tensor {tensor}: scales must be finite "
                                         r"and > 0; 1 of 2 are not"):
        build({**state, tensor: torch.tensor([0.5, value])}, kv_cache_dtype="fp8_e4m3")


def test_kv_scales_after_an_all_zero_first_batch_come_from_the_first_batch_with_a_range(
        state):
    model, ctx = build(state, kv_cache_dtype="fp8_e4m3", calculate_kv_scales=True)
    attn = model.model.layers[0].self_attn.attn
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    batch = PagedBatch(ctx, TINY.num_hidden_layers, 1, 16)
    rng = torch.Generator().manual_seed(0)
    width = attn.num_kv_heads * attn.head_size

    def step(context: int, key: torch.Tensor, value: torch.Tensor) -> None:
        _, metadata = batch.step([context], [len(key)])
        query = torch.randn(len(key), attn.num_heads * attn.head_size, generator=rng)
        with torch.inference_mode():
            attn(query, key, value, batch.kv_caches[0], metadata)

    step(4, torch.zeros(4, width), torch.zeros(4, width))
    assert attn.k_scale.tolist() == attn.v_scale.tolist() == [1.0, 1.0]  # still to come
    key = torch.randn(4, width, generator=rng) * 3
    value = torch.randn(4, width, generator=rng) * 1e-3  # below the floor
    step(8, key, value)
    assert attn.k_scale.tolist() == pytest.approx([float(key.abs().max()) / fp8_max] * 2)
    assert attn.v_scale.tolist() == pytest.approx([1 / fp8_max] * 2)


@pytest.mark.parametrize("theta", [0, -10000.0, math.nan, math.inf, "fast", None])
def test_a_rope_theta_that_is_not_a_finite_positive_number_is_refused(state, theta):
    config = LlamaConfig(**{**TINY.to_dict(), "rope_theta": theta})
    if hasattr(config, "rope_parameters") and config.rope_parameters:
        config.rope_parameters = {**config.rope_parameters, "rope_theta": theta}
    with pytest.raises(ModelError, match="config rope_theta must be a finite number above 0"):
        build(state, config)


@pytest.mark.parametrize("value", NOT_FINITE)
def test_a_non_finite_fp8_block_scale_is_refused_naming_the_tensor(tmp_path, value):
    write_quantized(random_weights(FP8_BLOCKS), FP8_BLOCKS.to_dict(), "fp8-block", tmp_path,
                    {})
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    bad = load_file(tmp_path / "model.safetensors")[name].clone()
    bad[0, 0] = value
    edit_tensors(tmp_path, **{name.replace(".", "__"): bad})
    with pytest.raises(ModelError, match=rf"checkpoint tensor {name}: scales must be finite; "
                                         r"1 of \d+ are not"):
        build_model(Checkpoint(AutoConfig.from_pretrained(tmp_path), None, tmp_path,
                               "safetensors", (tmp_path / "model.safetensors",)),
                    dtype="float32", block_size=8)


@pytest.fixture(scope="module", params=[Q.Q4_K, Q.Q6_K])
def k_quant_gguf(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's first two layers with ffn_down in a K-quant (its other matrices
    stay Q4_1)."""
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "k.gguf",
                       layers=2, vocab=256, retype={"ffn_down": int(request.param)})


@pytest.mark.parametrize("value", NOT_FINITE)
@pytest.mark.parametrize("tensor", ["blk.1.ffn_down.weight", "blk.0.attn_q.weight"])
def test_a_non_finite_gguf_block_scale_is_refused_naming_the_tensor(k_quant_gguf, tmp_path,
                                                                     tensor, value):
    path = tmp_path / "bad.gguf"
    shutil.copyfile(k_quant_gguf, path)
    stored = next(t for t in GGUFReader(path).tensors if t.name == tensor)
    kind = stored.tensor_type
    last = SCALE_FIELDS[kind][-1]  # dmin / m where the type has one
    offset = stored.data_offset + 3 * GGML_QUANT_SIZES[kind][1] + last  # of block 3
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(np.array([value], dtype=np.float16).tobytes())
    with pytest.raises(ModelError, match=rf"tensor {tensor} \({kind.name}\) has 1 NaN or "
                                         "infinite block scales"):
        load_checkpoint(path)


def test_the_checks_pass_what_a_real_checkpoint_holds(state, k_quant_gguf):
    build({**state, "model.layers.0.self_attn.k_scale": torch.tensor(0.02)},
          kv_cache_dtype="fp8_e4m3")
    load_checkpoint(k_quant_gguf)
