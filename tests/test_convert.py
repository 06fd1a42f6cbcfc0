"""``hwplug convert``: a GGUF written out as a Hugging Face directory of float safetensors
that transformers and hwplug load with the same weights and tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_checkpoints import shrink_gguf
from transformers import AutoModelForCausalLM, AutoTokenizer

import hwplug
from hwplug.errors import ConfigError
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.export import export_hf


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf",
                       layers=2, vocab=1536)


def test_convert_writes_what_transformers_loads_with_the_ggufs_weights(small_gguf, tmp_path):
    out = tmp_path / "hf"
    done = subprocess.run([sys.executable, "-m", "hwplug", "convert", str(small_gguf),
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model-00001-of-00001.safetensors"}
    want = dict(load_checkpoint(small_gguf, dequantize=True).weights())
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    got = model.state_dict()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert model.config.tie_word_embeddings and "lm_head.weight" not in index["weight_map"]
    text = "The capital of France is"
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == \
        load_checkpoint(small_gguf).tokenizer(text).input_ids


def test_bfloat16_shards_load_in_hwplug_as_the_gguf_does(small_gguf, tmp_path):
    out = export_hf(small_gguf, tmp_path / "hf", "bfloat16", shard_bytes=2**20)
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 2
    stored = {name: t for shard in shards for name, t in load_file(shard).items()}
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    want = dict(load_checkpoint(small_gguf, dequantize=True).weights())
    assert stored.keys() == want.keys()
    assert all(torch.equal(stored[k], want[k].to(torch.bfloat16)) for k in want)
    params = hwplug.SamplingParams(max_tokens=6)
    converted = hwplug.LLM(out, dtype="bfloat16", num_kv_blocks=16)
    original = hwplug.LLM(small_gguf, dequantize=True, dtype="bfloat16", num_kv_blocks=16)
    prompt = list(range(5, 30))
    assert converted.generate(prompt, params)[0].token_ids == \
        original.generate(prompt, params)[0].token_ids
    converted.close()
    original.close()


def test_convert_refuses_a_used_directory_and_other_dtypes(small_gguf, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="exists and is not an empty directory"):
        export_hf(small_gguf, used)
    assert [p.name for p in used.iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match="choose one of: float32, bfloat16"):
        export_hf(small_gguf, tmp_path / "new", "float16")
    assert not (tmp_path / "new").exists()
