"""A conversion's plain tokenizer: a tokenizer whose saved files reproduce it loads as a
:class:`PlainTokenizer` (the tokenizers library and jinja2, no transformers), one they do
not reproduce keeps its class, anything a plain tokenizer does not do itself goes to the
transformers tokenizer of the same files, and a changed GGUF file gets a new conversion
with its own tokenizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tiny_checkpoints import shrink_gguf
from tokenizers import normalizers
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders import load_checkpoint, resolve_model
from hwplug.model_zoo.loaders.cache import entry_dir
from hwplug.model_zoo.loaders.hf_dir import load_tokenizer
from hwplug.model_zoo.loaders.plain_tokenizer import (
    PLAIN_TOKENIZER_NAME,
    TOKENIZER_PROBES,
    PlainTokenizer,
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


def _same_tokens(tokenizer: PreTrainedTokenizerFast, other: object) -> None:
    texts = [*TOKENIZER_PROBES, "Hello the world<|endoftext|>"]
    assert other(texts)["input_ids"] == tokenizer(texts)["input_ids"]
    assert [other(text).input_ids for text in texts] == [tokenizer(text).input_ids
                                                         for text in texts]
    assert other.decode(range(len(other))) == tokenizer.decode(range(len(tokenizer)))
    for prompt in (True, False):
        assert other.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt) \
            == tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=prompt)
    assert other.eos_token_id == tokenizer.eos_token_id


def _saved_plain(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> PlainTokenizer:
    tokenizer.save_pretrained(tmp_path)
    assert write_plain_tokenizer(tokenizer, tmp_path)
    loaded = load_tokenizer(tmp_path, None)
    assert type(loaded) is PlainTokenizer
    return loaded


def test_a_tokenizer_its_files_reproduce_loads_as_a_plain_tokenizer(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    loaded = _saved_plain(tmp_path, tokenizer)
    assert json.loads((tmp_path / PLAIN_TOKENIZER_NAME).read_text())["saved_by"] == \
        "Qwen2Tokenizer"
    assert tokenizer_differences(tokenizer, loaded) == []
    _same_tokens(tokenizer, loaded)
    assert loaded._transformers is None  # none of that needed transformers' tokenizer
    (tmp_path / PLAIN_TOKENIZER_NAME).unlink()
    assert type(load_tokenizer(tmp_path, None)) is Qwen2Tokenizer  # through AutoTokenizer


def test_a_tokenizer_its_files_do_not_reproduce_keeps_its_class(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    saved["normalizer"] = json.loads(normalizers.Lowercase().__getstate__())
    (tmp_path / "tokenizer.json").write_text(json.dumps(saved))  # Qwen2Tokenizer ignores it
    assert not write_plain_tokenizer(tokenizer, tmp_path)
    assert not (tmp_path / PLAIN_TOKENIZER_NAME).exists()
    loaded = load_tokenizer(tmp_path, None)
    assert type(loaded) is Qwen2Tokenizer
    _same_tokens(tokenizer, loaded)


def test_a_chat_template_a_plain_tokenizer_renders_otherwise_keeps_the_class(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()  # transformers' {% generation %} tag: not in plain jinja2
    tokenizer.chat_template = ("{% for m in messages %}{% generation %}{{ m.content }}"
                               "{% endgeneration %}{% endfor %}")
    tokenizer.save_pretrained(tmp_path)
    plain = PlainTokenizer.from_marker(tmp_path)
    assert plain is None
    assert not write_plain_tokenizer(tokenizer, tmp_path)
    assert not (tmp_path / PLAIN_TOKENIZER_NAME).exists()


def test_what_a_plain_tokenizer_does_not_do_itself_goes_to_transformers(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    tokenizer.add_tokens(["<tool>", "</tool>"])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|sep|>"]})
    loaded = _saved_plain(tmp_path, tokenizer)
    assert loaded.convert_tokens_to_ids(["<tool>", "<|sep|>", "Hell", "not a token"]) == \
        tokenizer.convert_tokens_to_ids(["<tool>", "<|sep|>", "Hell", "not a token"])
    assert loaded.convert_tokens_to_ids("not a token") == tokenizer.unk_token_id
    assert loaded.all_special_tokens == tokenizer.all_special_tokens
    assert loaded._transformers is None
    named = [{"role": "user", "content": "Hi", "name": "ann"}]  # a field beyond role/content
    assert loaded.apply_chat_template(named, tokenize=False) == \
        tokenizer.apply_chat_template(named, tokenize=False)
    assert type(loaded.transformers()) is PreTrainedTokenizerFast
    assert loaded.convert_ids_to_tokens([0, 1]) == tokenizer.convert_ids_to_tokens([0, 1])
    assert loaded.decode([0, 1], clean_up_tokenization_spaces=True) == tokenizer.decode(
        [0, 1], clean_up_tokenization_spaces=True)
    assert loaded("Hello <tool>", return_tensors="pt").input_ids.tolist() == \
        tokenizer("Hello <tool>", return_tensors="pt").input_ids.tolist()
    with pytest.raises(AttributeError):
        loaded.no_such_attribute  # noqa: B018


def test_a_marker_of_another_format_loads_through_the_class(tmp_path: Path):
    tokenizer = _qwen2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / PLAIN_TOKENIZER_NAME).write_text(json.dumps(
        {"loads_as": "PreTrainedTokenizerFast", "saved_by": "Qwen2Tokenizer"}))
    assert type(load_tokenizer(tmp_path, None)) is Qwen2Tokenizer


def test_a_gguf_conversion_caches_a_plain_tokenizer_and_a_changed_file_replaces_it(
        small_gguf: Path, cache_dir: Path, tmp_path: Path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(small_gguf.read_bytes())
    checkpoint = load_checkpoint(gguf)
    entry = entry_dir(gguf, "gguf-blocks")
    assert (entry / PLAIN_TOKENIZER_NAME).is_file()
    assert type(checkpoint.tokenizer) is PlainTokenizer
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
    # the new conversion replaced the old entry: the loaded tokenizer still encodes, and
    # what it would read from the entry's files says they are gone
    assert not entry.exists()
    assert checkpoint.tokenizer.encode("hello world") == reference.encode("hello world")
    with pytest.raises(ModelError, match="a newer conversion of the model's file replaced"):
        checkpoint.tokenizer.transformers()
