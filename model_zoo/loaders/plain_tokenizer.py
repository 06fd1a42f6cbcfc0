"""``PlainTokenizer``: a converted model's tokenizer, run by the tokenizers library alone.

A transformers fast tokenizer is a ``tokenizers.Tokenizer`` (``tokenizer.json``) plus
settings: special tokens, the chat template. A GGUF conversion (see :mod:`.gguf_file`)
writes those settings to :data:`PLAIN_TOKENIZER_NAME` when a :class:`PlainTokenizer` made
from them and ``tokenizer.json`` encodes, decodes and renders the chat template as the
transformers tokenizer does (:func:`write_plain_tokenizer`). A cached load then needs no
transformers import (about 0.5 s of a second-run cold start).

A :class:`PlainTokenizer` does itself what the engine asks of a tokenizer: encode text
(``tokenizer(text)``, :meth:`~PlainTokenizer.encode`), decode ids, render a conversation of
``{"role", "content"}`` string messages as text. Anything else (another attribute, a call
with options such as ``return_tensors`` or ``tokenize=True``, messages with other fields)
goes to the transformers tokenizer of the same files, loaded on first need
(:meth:`~PlainTokenizer.transformers`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import tokenizers

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.checkpoint import from_pretrained

logger = logging.getLogger(__name__)

PLAIN_TOKENIZER_NAME = "hwplug_tokenizer.json"
#: Bump when the marker's content changes: a marker of another format is not read.
MARKER_FORMAT = 2
#: The transformers tokenizer's settings a marker copies (as JSON values).
TOKENIZER_SETTINGS = ("chat_template", "special_tokens_map", "all_special_ids",
                      "all_special_tokens", "bos_token_id", "eos_token_id", "pad_token_id",
                      "unk_token_id", "bos_token", "eos_token", "pad_token", "unk_token",
                      "model_max_length", "padding_side", "truncation_side",
                      "clean_up_tokenization_spaces")
#: Texts a plain tokenizer must encode as transformers does (with the special tokens joined).
TOKENIZER_PROBES = ("Hello, world!", "  two spaces,\ttabs\n\nand new lines \r\n",
                    "Ünïcödé: 中文, 😀, café, naïve", "def f(x):\n    return x ** 2  # code",
                    "1234567890 3.14159e-3 0x1F", "")
#: Conversations a plain tokenizer must render as transformers does.
CHAT_PROBES = ([{"role": "user", "content": "Hi there"}],
               [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}])


class Encoded(dict):
    """What calling a tokenizer gives: ``input_ids`` and ``attention_mask``, as keys and as
    attributes (as a transformers ``BatchEncoding``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class PlainTokenizer:
    """The tokenizer of ``directory``: its ``tokenizer.json`` run by the tokenizers library,
    with the :data:`TOKENIZER_SETTINGS` of ``settings`` as attributes (``eos_token_id``,
    ``chat_template``...). Attributes it lacks are the transformers tokenizer's."""

    is_fast = True

    def __init__(self, directory: Path, settings: Mapping[str, Any]) -> None:
        self._directory = directory
        self._added = settings.get("added_tokens_decoder", {})
        self._transformers: Any = None
        try:
            self.backend_tokenizer = tokenizers.Tokenizer.from_file(
                str(directory / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises its own exception types
            raise ModelError(f"cannot load the tokenizer from {directory}: {exc}") from exc
        # transformers turns off the file's padding and truncation for a plain call
        self.backend_tokenizer.no_padding()
        self.backend_tokenizer.no_truncation()
        for name in TOKENIZER_SETTINGS:
            setattr(self, name, settings[name])

    @classmethod
    def from_marker(cls, directory: Path) -> PlainTokenizer | None:
        """The plain tokenizer ``directory``'s marker describes, or None when it has no
        marker of :data:`MARKER_FORMAT`. Raises :class:`ModelError` for an unreadable one."""
        marker = directory / PLAIN_TOKENIZER_NAME
        if not marker.is_file():
            return None
        try:
            settings = json.loads(marker.read_text())
            if settings.get("format") != MARKER_FORMAT:
                return None
            return cls(directory, settings)
        except (OSError, ValueError, AttributeError, KeyError) as exc:
            raise ModelError(f"cannot read {marker}: {exc}") from exc

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str | Sequence[str], add_special_tokens: bool = True,
                 **options: Any) -> Any:
        if options:
            return self.transformers()(text, add_special_tokens=add_special_tokens, **options)
        if isinstance(text, str):
            ids = self.encode(text, add_special_tokens)
            return Encoded(input_ids=ids, attention_mask=[1] * len(ids))
        batch = [e.ids for e in self.backend_tokenizer.encode_batch(
            list(text), add_special_tokens=add_special_tokens)]
        return Encoded(input_ids=batch, attention_mask=[[1] * len(ids) for ids in batch])

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``."""
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: int | Iterable[int], skip_special_tokens: bool = False,
               **options: Any) -> str:
        """The text of ``ids`` (one id or several: ints, or a tensor of them); other
        options go to the transformers tokenizer."""
        if options:
            return self.transformers().decode(ids, skip_special_tokens=skip_special_tokens,
                                              **options)
        ids = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        return self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        """Every token (added ones included) and its id."""
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """The id of a token, or the ids of several (``unk_token_id`` for one not in the
        vocabulary, as transformers gives)."""
        def one(token: str) -> int | None:
            index = self.backend_tokenizer.token_to_id(token)
            return self.unk_token_id if index is None else index

        return one(tokens) if isinstance(tokens, str) else [one(token) for token in tokens]

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]],
                            tokenize: bool = True, add_generation_prompt: bool = False,
                            **options: Any) -> Any:
        """``conversation`` rendered by :attr:`chat_template` as text, for
        ``{"role", "content"}`` string messages and ``tokenize=False``; other messages and
        options (``tokenize`` among them) go to the transformers tokenizer."""
        if (tokenize or options or not self.chat_template
                or not _plain_messages(conversation)):
            return self.transformers().apply_chat_template(
                conversation, tokenize=tokenize, add_generation_prompt=add_generation_prompt,
                **options)
        return _compiled(self.chat_template).render(
            messages=[dict(message) for message in conversation], tools=None,
            documents=None, add_generation_prompt=add_generation_prompt,
            **self.special_tokens_map)

    def transformers(self) -> Any:
        """The transformers ``PreTrainedTokenizerFast`` of the same files (loaded once).
        Raises :class:`ModelError` when they are gone: a conversion cache entry that a newer
        conversion of its source file replaced."""
        if self._transformers is None:
            if not self._directory.is_dir():
                raise ModelError(
                    f"the tokenizer's files in {self._directory} are gone: a newer conversion "
                    f"of the model's file replaced that cache entry; load the model again")
            from transformers import PreTrainedTokenizerFast

            self._transformers = from_pretrained(PreTrainedTokenizerFast, "tokenizer",
                                                 self._directory,
                                                 added_tokens_decoder=self._added)
        return self._transformers

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.transformers(), name)

    def __repr__(self) -> str:
        return f"PlainTokenizer({str(self._directory)!r}, vocabulary {len(self)})"


def write_plain_tokenizer(tokenizer: Any, directory: Path) -> bool:
    """Write ``directory``/:data:`PLAIN_TOKENIZER_NAME` for ``tokenizer`` (a transformers
    tokenizer already saved in ``directory``) if a :class:`PlainTokenizer` of its files and
    settings has its vocabulary, encodes :data:`TOKENIZER_PROBES` (and its special tokens),
    decodes every id and renders :data:`CHAT_PROBES` as it does; return whether it did."""
    if not (directory / "tokenizer.json").is_file():  # a slow tokenizer's files
        return False
    added = {str(i): token.__getstate__() for i, token in tokenizer.added_tokens_decoder.items()}
    try:
        settings = json.loads(json.dumps({name: getattr(tokenizer, name, None)
                                          for name in TOKENIZER_SETTINGS}))
    except TypeError as exc:  # a setting JSON cannot hold
        logger.debug("%s keeps its tokenizer class: %s", directory, exc)
        return False
    settings |= {"format": MARKER_FORMAT, "saved_by": type(tokenizer).__name__,
                 "added_tokens_decoder": added}
    differ = tokenizer_differences(tokenizer, PlainTokenizer(directory, settings))
    if differ:
        logger.debug("%s keeps its tokenizer class %s: a plain one differs in %s", directory,
                     type(tokenizer).__name__, ", ".join(differ))
        return False
    (directory / PLAIN_TOKENIZER_NAME).write_text(json.dumps(settings))
    return True


def tokenizer_differences(tokenizer: Any, plain: PlainTokenizer) -> list[str]:
    """What of :func:`write_plain_tokenizer`'s comparison differs between ``tokenizer``
    and ``plain`` (empty: nothing)."""
    differ = []
    if len(tokenizer) != len(plain) or tokenizer.get_vocab() != plain.get_vocab():
        differ.append("vocabulary")
    texts = [*TOKENIZER_PROBES, " ".join(tokenizer.all_special_tokens) + " Hi!"]
    for special in (True, False):
        if tokenizer(texts, add_special_tokens=special)["input_ids"] != plain(
                texts, add_special_tokens=special)["input_ids"]:
            differ.append(f"encoding (add_special_tokens={special})")
        every_id = list(range(len(tokenizer)))
        if tokenizer.decode(every_id, skip_special_tokens=special) != plain.decode(
                every_id, skip_special_tokens=special):
            differ.append(f"decoding (skip_special_tokens={special})")
    if tokenizer.chat_template:
        for conversation in CHAT_PROBES:
            for prompt in (True, False):
                try:
                    same = tokenizer.apply_chat_template(
                        conversation, tokenize=False, add_generation_prompt=prompt) == \
                        plain.apply_chat_template(conversation, tokenize=False,
                                                  add_generation_prompt=prompt)
                except Exception as exc:  # jinja2 raises many types for a template
                    logger.debug("rendering the chat template failed: %r", exc)
                    same = False
                if not same:
                    differ.append("chat template")
                    return differ
    return differ


def _plain_messages(conversation: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every message is a ``{"role", "content"}`` mapping of strings."""
    return all(isinstance(message, Mapping) and set(message) <= {"role", "content"}
               and all(isinstance(value, str) for value in message.values())
               for message in conversation)


@cache
def _compiled(template: str) -> Any:
    """``template`` compiled in a sandbox set up as transformers sets up its own: blocks
    trimmed, loop controls, ``tojson`` without HTML escaping, ``raise_exception`` and
    ``strftime_now``."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment.from_string(template)
