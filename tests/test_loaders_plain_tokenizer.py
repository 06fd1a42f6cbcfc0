"""A conversion's plain tokenizer: a tokenizer whose saved files reproduce it loads as a
plain ``PreTrainedTokenizerFast`` (no ``AutoTokenizer``, no class rebuilding its vocabulary
in Python), one they do not reproduce keeps its class, and a changed GGUF file gets a new
conversion with its own tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tiny_checkpoints import shrink_gguf
from tokenizers import normalizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer

from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import entry_dir
from hwplug.model_zoo.loaders.hf_dir import (
    PLAIN_TOKENIZER_NAME,
    TOKENIZER_PROBES,
    load_tokenizer,
    tokenizer_differences,
    write_plain_tokenizer,
)

CHAT = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shrink_gguf(resolve_model(None), tmp_path_factory.mktemp("gguf") / "small.gguf")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HWPLUG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _qwen2_tokenizer() -> Qwen2Tokenizer:
    """A byte-level BPE ``Qwen2Tokenizer`` (a class that rebuilds its pipeline from the
    vocabulary) over the 256 bytes and a few merges, with a chat template."""
    symbols = sorted(ByteLevel.alphabet())
    vocab = {symbol: index for index, symbol in enumerate(symbols)}
    merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("Ġ", "t"), ("h", "e")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=merges, eos_token="<|endoftext|>",
                               pad_token="<|endoftext|>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}"
                               "<|endoftext|>{% endfor %}")
    return tokenizer


def _same_tokens(tokenizer: PreTrainedTokenizerFast, other: PreTrainedTokenizerFast) -> None:
    texts = [*TOKENIZER_PROBES, "Hello the world<|endoftext|>"]
    assert other(texts)["input_ids"] == tokenizer(texts)["input_ids"]
    assert other.decode(range(len(other))) == tokenizer.decode(range(len(tokenizer)))
    assert other.apply_chat_template(CHAT, tokenize=False) == tokenizer.apply_chat_template(
        CHAT, tokenize=False)
    assert other.eos_token_id == tokenizer.eos_token_id


def test_a_tokenizer_its_files_reproduce_loads_as_a_plain_fast_tokenizer(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    assert write_plain_tokenizer(tokenizer, tmp_path)
    marker = json.loads((tmp_path / PLAIN_TOKENIZER_NAME).read_text())
    assert marker["saved_by"] == "Qwen2Tokenizer"
    loaded = load_tokenizer(tmp_path, None)
    assert type(loaded) is PreTrainedTokenizerFast
    assert tokenizer_differences(tokenizer, loaded) == []
    _same_tokens(tokenizer, loaded)
    (tmp_path / PLAIN_TOKENIZER_NAME).unlink()
    assert type(load_tokenizer(tmp_path, None)) is Qwen2Tokenizer  # through AutoTokenizer


def test_a_tokenizer_its_files_do_not_reproduce_keeps_its_class(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    saved["normalizer"] = json.loads(normalizers.Lowercase().__getstate__())
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))  # Qwen2Tokenizer ignores it
    plain = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert "encoding (add_special_tokens=True)" in tokenizer_differences(tokenizer, plain)
    assert not write_plain_tokenizer(tokenizer, tmp_path)
    assert not (tmp_path / PLAIN_TOKENIZER_NAME).exists()
    loaded = load_tokenizer(tmp_path, None)
    assert type(loaded) is Qwen2Tokenizer
    _same_tokens(tokenizer, loaded)


def test_a_gguf_conversion_caches_a_plain_tokenizer_and_a_changed_file_replaces_it(
        small_gguf: Path, cache_dir: Path, tmp_path: Path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(small_gguf.read_bytes())
    checkpoint = load_checkpoint(gguf)
    entry = entry_dir(gguf, "gguf-blocks")
    assert (entry / PLAIN_TOKENIZER_NAME).is_file()
    assert type(checkpoint.tokenizer) is PreTrainedTokenizerFast
    reference = AutoTokenizer.from_pretrained(entry, local_files_only=True)
    _same_tokens(reference, checkpoint.tokenizer)
    assert len(checkpoint.tokenizer) == 256

    shrink_gguf(resolve_model(None), gguf, vocab=300)  # the same path, another file
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # however coarse the clock
    changed = load_checkpoint(gguf)
    assert entry_dir(gguf, "gguf-blocks") != entry
    assert (entry_dir(gguf, "gguf-blocks") / PLAIN_TOKENIZER_NAME).is_file()
    assert len(changed.tokenizer) == 300
    assert reference.get_vocab() == {
        token: index for token, index in changed.tokenizer.get_vocab().items() if index < 256}


def test_the_marker_lists_the_added_tokens_so_tokenizer_json_is_not_parsed_in_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """transformers reads a fast tokenizer's added tokens by parsing all of
    ``tokenizer.json`` in Python unless it is given them: the marker lists them, and the
    plain load given them is the same tokenizer without that parse; a marker written
    before it listed them still loads (with the parse)."""
    import transformers.tokenization_utils_base as base

    tokenizer = _qwen2_tokenizer()
    tokenizer.add_tokens(["<tool>", "</tool>"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})
    tokenizer.save_pretrained(tmp_path)
    assert write_plain_tokenizer(tokenizer, tmp_path)
    marker = json.loads((tmp_path / PLAIN_TOKENIZER_NAME).read_text())
    assert {int(i): t for i, t in marker["added_tokens_decoder"].items()} == {
        i: t.__getstate__() for i, t in tokenizer.added_tokens_decoder.items()}
    parsed = []

    class Json:  # transformers' json module, recording which files it parses
        def __getattr__(self, name):
            return getattr(json, name)

        def load(self, handle, **kwargs):
            parsed.append(Path(handle.name).name)
            return json.load(handle, **kwargs)

    monkeypatch.setattr(base, "json", Json())
    loaded = load_tokenizer(tmp_path, None)
    assert "tokenizer.json" not in parsed
    assert tokenizer_differences(tokenizer, loaded) == []
    _same_tokens(tokenizer, loaded)
    assert loaded.convert_tokens_to_ids(["<tool>", "<|sep|>"]) == \
        tokenizer.convert_tokens_to_ids(["<tool>", "<|sep|>"])
    del marker["added_tokens_decoder"]  # as written before
    (tmp_path / PLAIN_TOKENIZER_NAME).write_text(json.dumps(marker))
    loaded = load_tokenizer(tmp_path, None)
    assert "tokenizer.json" in parsed
    assert tokenizer_differences(tokenizer, loaded) == []
