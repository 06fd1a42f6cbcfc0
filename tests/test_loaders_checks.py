"""A checkpoint is checked before anything is allocated: sizes, tensors, dtypes, memory.

Checkpoints are real files: a tiny Llama directory saved by transformers (tests/
tiny_checkpoints.py) with its config or tensors edited, and copies of the packaged SmolLM2
GGUF with one metadata value changed in place.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from fake_hw import write
from gguf import GGUFReader
from tiny_checkpoints import (
    edit_config,
    edit_tensors,
    gguf_with_field,
    shrink_gguf,
    write_tiny_llama,
)

from hwplug import current_platform
from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import build_model, create_context
from hwplug.model_zoo.llm_config import LLMConfig
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import entry_dir
from hwplug.model_zoo.loaders.memory import estimate_memory
from hwplug.model_zoo.registry import get_model_class
from hwplug.platforms.cpu.platform import CpuPlatform

K_PROJ = "model.layers.0.self_attn.k_proj.weight"


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_tiny_llama(tmp_path / "tiny")


def test_the_tiny_llama_loads_and_builds(tiny: Path):
    checkpoint = load_checkpoint(tiny)
    model, _ = build_model(checkpoint)
    assert model.num_layers == 2
    assert torch.equal(dict(model.named_parameters())["model.norm.weight"],
                       dict(checkpoint.weights())["model.norm.weight"])


@pytest.mark.parametrize("size, value, message", [
    ("num_hidden_layers", 10**7, "invalid config sizes: num_hidden_layers=10000000 (must be "
                                 "an integer from 1 to 1024)"),
    ("hidden_size", 0, "invalid config sizes: hidden_size=0 (must be an integer from 1 to "
                       "131072)"),
    ("vocab_size", -5, "invalid config sizes: vocab_size=-5"),
    ("intermediate_size", 10**9, "invalid config sizes: intermediate_size=1000000000 (must "
                                 "be an integer from 1 to 1048576)"),
    # transformers' own validation of the config's types comes first
    ("num_attention_heads", 2.5, "Field 'num_attention_heads' expected int, got float"),
])
def test_a_size_out_of_range_is_refused_naming_it(tiny: Path, size, value, message):
    edit_config(tiny, **{size: value})
    with pytest.raises(ModelError) as error:
        load_checkpoint(tiny)
    assert message in str(error.value) and str(tiny) in str(error.value)


def test_fewer_layers_than_the_tensors_hold_is_refused(tiny: Path):
    edit_config(tiny, num_hidden_layers=1)
    with pytest.raises(ModelError, match=r"num_hidden_layers=1, but the tensors are of 2 "
                                         r"layers \(indices 0..1\); layers 1 are beyond"):
        load_checkpoint(tiny)


def test_more_layers_than_the_tensors_hold_is_refused(tiny: Path):
    edit_config(tiny, num_hidden_layers=5)
    with pytest.raises(ModelError, match="layers 2..4 have no tensors"):
        load_checkpoint(tiny)


def test_vocabulary_heads_and_mlp_must_match_the_tensors(tiny: Path, tmp_path: Path):
    edit_config(tiny, vocab_size=100)
    with pytest.raises(ModelError, match=r"tensor model.embed_tokens.weight in .*"
                                         r"model.safetensors has shape \(64, 32\), but dim 0 "
                                         r"should be vocab_size = 100"):
        load_checkpoint(tiny)
    other = write_tiny_llama(tmp_path / "heads")
    edit_config(other, num_key_value_heads=4)
    with pytest.raises(ModelError, match=rf"tensor {K_PROJ} .* has shape \(16, 32\), but dim 0 "
                                         r"should be num_key_value_heads \* head_dim = 32"):
        load_checkpoint(other)
    edit_config(other, num_key_value_heads=2, intermediate_size=48)
    with pytest.raises(ModelError, match=r"down_proj.weight in .* has shape \(32, 64\), but dim "
                                         r"1 should be intermediate_size = 48"):
        load_checkpoint(other)
    edit_config(other, num_key_value_heads=3)
    with pytest.raises(ModelError, match="num_attention_heads=4 is not a multiple of "
                                         "num_key_value_heads=3"):
        load_checkpoint(other)


def test_an_end_of_sequence_id_outside_the_vocabulary_is_refused(tiny: Path):
    (tiny / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 64]}))
    with pytest.raises(ModelError, match=r"end-of-sequence token ids \[64\] are outside the "
                                         r"vocabulary \(vocab_size 64\)"):
        load_checkpoint(tiny)


def test_a_zero_sized_tensor_is_refused_naming_file_and_tensor(tiny: Path):
    edit_tensors(tiny, model__norm__weight=torch.ones(0))
    with pytest.raises(ModelError, match=r"tensor model.norm.weight in .*model.safetensors "
                                         r"has a zero-sized dimension \(0,\)"):
        load_checkpoint(tiny)


@pytest.mark.parametrize("dtype, kind", [(torch.int8, "int"), (torch.int32, "int"),
                                         (torch.float8_e4m3fn, "fp8"), (torch.bool, "bool")])
def test_a_tensor_of_another_dtype_kind_is_refused(tiny: Path, dtype, kind):
    shape = load_checkpoint(tiny).config.hidden_size // 2, 32
    edit_tensors(tiny, **{K_PROJ.replace(".", "__"): torch.ones(shape).to(dtype)})
    with pytest.raises(ModelError, match=rf"checkpoint tensor {K_PROJ} is "
                                         rf"{str(dtype)[6:]} \({kind}\), but parameter "
                                         r"model.layers.0.self_attn.qkv_proj.weight holds "
                                         r"float32 \(float\)"):
        build_model(load_checkpoint(tiny), dtype="float32")


def test_a_cast_within_a_kind_loads(tiny: Path):
    stored = load_checkpoint(tiny)
    k_proj = dict(stored.weights())[K_PROJ].to(torch.bfloat16)
    edit_tensors(tiny, **{K_PROJ.replace(".", "__"): k_proj})
    model, _ = build_model(load_checkpoint(tiny), dtype="float32")
    qkv = dict(model.named_parameters())["model.layers.0.self_attn.qkv_proj.weight"]
    assert torch.equal(qkv[32:48], k_proj.float())  # rows of k after q's 32


def test_memory_estimate_is_what_the_llm_allocates(tiny: Path):
    from hwplug import LLM

    checkpoint = load_checkpoint(tiny)
    model_cls = get_model_class("LlamaForCausalLM")
    ctx = create_context(model_cls, checkpoint.config, current_platform(),
                         LLMConfig(dtype="float32"))
    estimate = estimate_memory(model_cls, checkpoint.config, ctx)
    blocks = math.ceil(128 / ctx.engine_config.block_size)
    llm = LLM(str(tiny), dtype="float32", num_kv_blocks=blocks)
    tensors = [*llm.model.parameters(), *llm.model.buffers()]
    assert estimate.weights == sum(t.numel() * t.element_size() for t in tensors)
    assert estimate.kv_tokens == 128
    assert estimate.kv_cache == sum(c.numel() * c.element_size() for c in llm.runner.kv_caches)


def test_a_model_that_does_not_fit_is_refused_before_allocation(tiny: Path, tmp_path: Path,
                                                                 monkeypatch):
    # Simulated at the probe boundary: /proc/meminfo says 8 KiB are available.
    write(tmp_path, "proc/meminfo", "MemTotal:  1048576 kB\nMemFree:  4 kB\n"
                                    "MemAvailable:  8 kB\n")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    checkpoint = load_checkpoint(tiny)
    with pytest.raises(ModelError) as error:
        build_model(checkpoint, dtype="float32", platform=CpuPlatform())
    model_cls = get_model_class("LlamaForCausalLM")
    estimate = estimate_memory(model_cls, checkpoint.config,
                               create_context(model_cls, checkpoint.config, CpuPlatform(),
                                              LLMConfig(dtype="float32")))
    kib = [f"{n / 1024:.2f} KiB" for n in (estimate.total, estimate.weights, estimate.kv_cache)]
    assert str(error.value) == (
        f"the model needs about {kib[0]} (weights {kib[1]} in float32 + KV cache of 128 tokens "
        f"in float32 {kib[2]}), but platform cpu has 8.00 KiB free (of 1.00 GiB): choose a "
        "smaller dtype or model, or free memory")


def test_a_max_model_len_whose_kv_cache_does_not_fit_is_a_config_error(
        tiny: Path, tmp_path: Path, monkeypatch):
    checkpoint = load_checkpoint(tiny)
    model_cls = get_model_class("LlamaForCausalLM")
    config = LLMConfig.create(dtype="float32", max_model_len=128)
    estimate = estimate_memory(model_cls, checkpoint.config, create_context(
        model_cls, checkpoint.config, CpuPlatform(), config), kv_tokens=128)
    # Simulated at the probe boundary: the weights fit, half the KV cache of 128 tokens too
    free_kib = (estimate.weights + estimate.kv_cache // 2) // 1024
    write(tmp_path, "proc/meminfo", f"MemTotal:  1048576 kB\nMemFree:  4 kB\n"
                                    f"MemAvailable:  {free_kib} kB\n")
    monkeypatch.setenv("HWPLUG_PROBE_ROOT", str(tmp_path))
    with pytest.raises(ConfigError) as error:
        build_model(checkpoint, platform=CpuPlatform(), config=config)
    left = free_kib * 1024 - estimate.weights
    longest = int(left // (estimate.kv_cache / 128))
    assert 0 < longest < 128
    assert str(error.value) == (
        f"max_model_len=128 needs a KV cache of {estimate.kv_cache / 1024:.2f} KiB (float32) "
        f"for one sequence, but platform cpu has {left / 1024:.2f} KiB free after the weights "
        f"({estimate.weights / 1024:.2f} KiB): choose max_model_len <= {longest}, or a "
        "smaller kv_cache_dtype")


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged SmolLM2 GGUF cut to 2 layers and 256 tokens (a real file's structure,
    parsed in milliseconds rather than seconds)."""
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf")


@pytest.mark.parametrize("value, message", [
    (1, r"num_hidden_layers=1, but the tensors are of 2 layers \(indices 0..1\); layers 1 are "
        r"beyond the config's count"),
    (10**7, r"num_hidden_layers=10000000 \(must be an integer from 1 to 1024\)"),
])
def test_a_gguf_block_count_that_disagrees_is_refused_before_conversion(
        small_gguf: Path, tmp_path: Path, value, message):
    edited = gguf_with_field(small_gguf, tmp_path / "edited.gguf", "llama.block_count", value)
    with pytest.raises(ModelError, match=message) as error:
        load_checkpoint(edited)
    assert str(edited) in str(error.value)
    assert not entry_dir(edited, "gguf").exists()  # nothing converted


def test_a_gguf_vocabulary_other_than_its_tokens_is_refused(small_gguf: Path, tmp_path: Path):
    edited = gguf_with_field(small_gguf, tmp_path / "vocab.gguf", "llama.vocab_size", 50000)
    with pytest.raises(ModelError, match="tokenizer.ggml.tokens holds 256 tokens, but "
                                         "llama.vocab_size is 50000"):
        load_checkpoint(edited)


def test_architectures_must_name_classes(tiny: Path):
    edit_config(tiny, architectures=3)
    with pytest.raises(ModelError, match="config.architectures is 3, not a list of model "
                                         "class names"):
        load_checkpoint(tiny)


def _retarget(source: Path, target: Path, tensor: str, offset_of: str, shift: int = 0) -> Path:
    """Copy GGUF ``source`` to ``target`` with ``tensor``'s data offset set to that of
    ``offset_of`` plus ``shift`` bytes (its table entry edited in place)."""
    shutil.copyfile(source, target)
    reader = GGUFReader(target, "r+")
    tensors = {t.name: t for t in reader.tensors}
    relative = int(tensors[offset_of].data_offset) - reader.data_offset + shift
    tensors[tensor].field.parts[-1][0] = relative  # the entry's last part: its offset
    reader.data.flush()
    del reader
    return target


@pytest.mark.parametrize("shift, message", [
    (0, "tensors blk.0.attn_k.weight and blk.0.attn_q.weight overlap"),
    (4, "tensor blk.0.attn_q.weight's data at .* is not aligned to 32 bytes"),
    (10**9, "not a readable GGUF file .*truncated tensor data"),  # GGUFReader's own check
])
def test_a_gguf_whose_tensor_table_points_at_bad_data_is_refused(
        small_gguf: Path, tmp_path: Path, shift, message):
    edited = _retarget(small_gguf, tmp_path / "aliased.gguf", "blk.0.attn_q.weight",
                       "blk.0.attn_k.weight", shift)
    with pytest.raises(ModelError, match=message) as error:
        load_checkpoint(edited)
    assert str(edited) in str(error.value)
    assert not entry_dir(edited, "gguf").exists()  # nothing converted
