"""A GGUF conversion's plain config: every field of the architecture's config, loaded
without importing transformers (a second-run cold start's largest import after torch), and
the rotary cache built without torch's meta-device arange (which imports torch._dynamo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_checkpoints import shrink_gguf
from transformers import AutoConfig, GPT2Config, PretrainedConfig, Qwen2Config, Qwen3Config

from hwplug.errors import ModelError
from hwplug.kernel_registry.reference import build_cos_sin_cache
from hwplug.model_zoo.context import checkpoint_dtype
from hwplug.model_zoo.layers.rotary import RotaryEmbedding
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import entry_dir
from hwplug.model_zoo.loaders.hf_dir import load_config
from hwplug.model_zoo.loaders.plain_config import (
    PLAIN_CONFIG_NAME,
    PlainConfig,
    write_plain_config,
)

#: transformers (its config classes, tokenizers, chat templates) and torch._dynamo (imported
#: by transformers' config validators and by torch's meta-device arange): a cached load
#: and a chat generation need neither.
HEAVY_MODULES = ("transformers", "torch._dynamo")


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fields(config: PretrainedConfig | PlainConfig) -> dict:
    """``config``'s fields as JSON values (a plain config holds them as JSON reads them)."""
    fields = config.to_dict()
    for name in ("_name_or_path", "model_type", "use_cache", "transformers_version"):
        fields.pop(name, None)
    return json.loads(json.dumps(fields, default=lambda v: str(v).removeprefix("torch.")))


def test_a_gguf_conversion_loads_as_a_plain_config_with_every_field(small_gguf: Path,
                                                                    cache_dir: Path):
    checkpoint = load_checkpoint(small_gguf)
    entry = entry_dir(small_gguf, "gguf-blocks")
    assert (entry / PLAIN_CONFIG_NAME).is_file() and (entry / "config.json").is_file()
    assert type(checkpoint.config) is PlainConfig
    assert checkpoint.config.model_type == "llama"
    reference = AutoConfig.from_pretrained(entry, local_files_only=True)  # config.json
    assert type(reference).__name__ == "LlamaConfig"
    assert _fields(checkpoint.config) == _fields(reference)
    upgraded = checkpoint.transformers_config()
    assert type(upgraded) is type(reference)
    assert upgraded.to_dict() | {"_name_or_path": ""} == reference.to_dict() | {
        "_name_or_path": ""}
    again = load_checkpoint(small_gguf)
    assert again.config.to_dict() == checkpoint.config.to_dict()


def test_a_config_class_whose_aliases_a_plain_config_lacks_keeps_its_class(tmp_path: Path):
    gpt2 = GPT2Config(n_layer=2)  # num_hidden_layers is an alias of n_layer
    assert not write_plain_config(gpt2, tmp_path)
    assert not (tmp_path / PLAIN_CONFIG_NAME).exists()

    qwen3 = Qwen3Config(num_hidden_layers=3, architectures=["Qwen3ForCausalLM"])
    assert write_plain_config(qwen3, tmp_path)
    qwen3.save_pretrained(tmp_path)
    loaded = load_config(tmp_path)
    assert type(loaded) is PlainConfig
    assert (loaded.num_hidden_layers, loaded.layer_types) == (3, qwen3.layer_types)
    assert _fields(loaded) == _fields(qwen3)
    (tmp_path / PLAIN_CONFIG_NAME).unlink()
    assert type(load_config(tmp_path)) is Qwen3Config  # config.json, through AutoConfig


@pytest.mark.filterwarnings("ignore:RotaryEmbedding was built without the model.s context")
def test_the_rotary_cache_is_made_on_the_default_device():
    with torch.device("meta"):
        meta = RotaryEmbedding(64, 128, 1e4)
    assert meta.cos_sin_cache.device.type == "meta"
    assert meta.cos_sin_cache.shape == (128, 64)
    assert torch.equal(RotaryEmbedding(64, 128, 1e4).cos_sin_cache,
                       build_cos_sin_cache(64, 128, 1e4))


@pytest.mark.slow
def test_a_dtype_and_integer_keys_read_as_json_values(tmp_path: Path):
    config = Qwen2Config(num_hidden_layers=2, architectures=["Qwen2ForCausalLM"],
                         dtype="bfloat16", id2label={0: "no", 1: "yes"})
    assert write_plain_config(config, tmp_path)
    loaded = load_config(tmp_path)
    assert (loaded.dtype, loaded.id2label) == ("bfloat16", {"0": "no", "1": "yes"})
    assert checkpoint_dtype(loaded) == checkpoint_dtype(config) == "bfloat16"


def test_an_unreadable_plain_config_is_a_model_error(tmp_path: Path):
    (tmp_path / PLAIN_CONFIG_NAME).write_text("[1, 2]")
    with pytest.raises(ModelError, match="not a JSON object"):
        load_config(tmp_path)
    (tmp_path / PLAIN_CONFIG_NAME).write_text("{")
    with pytest.raises(ModelError, match=PLAIN_CONFIG_NAME):
        load_config(tmp_path)


def test_a_cached_gguf_load_imports_neither_transformers_nor_dynamo(small_gguf: Path,
                                                                       cache_dir: Path):
    load_checkpoint(small_gguf)  # converts
    child = ("import json, sys, hwplug\n"
             f"llm = hwplug.LLM({str(small_gguf)!r})\n"
             "llm.generate('Hello', hwplug.SamplingParams(max_tokens=1))\n"
             "llm.generate([llm.apply_chat_template('Hi')], hwplug.SamplingParams(max_tokens=1))\n"
             f"print(json.dumps([m for m in {HEAVY_MODULES!r} if m in sys.modules]))\n")
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                            env={**os.environ, "HWPLUG_CACHE_DIR": str(cache_dir)},
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
