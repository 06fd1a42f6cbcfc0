"""Loading a Hugging Face model directory: ``config.json``, tokenizer files, safetensors weights.

Weights must be safetensors (``model.safetensors``, or ``model.safetensors.index.json`` and its
shards): pickle checkpoints (``pytorch_model.bin``, ``*.pt``) are refused, never unpickled.
Nothing is fetched from the network: every transformers call gets ``local_files_only=True``.

A directory hwplug converted (see :mod:`.gguf_file`) may also hold :data:`PLAIN_CONFIG_NAME`:
the architecture config's every field, loaded as a plain ``PretrainedConfig``. Importing an
architecture's config class imports much of transformers (its validators pull in
torch._dynamo and torch.distributed: about 1.3 s), so a cached load that skips it starts
that much sooner. Likewise :data:`PLAIN_TOKENIZER_NAME` marks a tokenizer that loads as a
plain ``PreTrainedTokenizerFast`` (its ``tokenizer.json`` read by the tokenizers library)
exactly as its class does: ``AutoTokenizer`` imports transformers' auto-config tables
(about 0.2 s) and a class such as ``Qwen2Tokenizer`` rebuilds its vocabulary in Python
(about 0.15 s for 150k tokens), neither of which a cached load then pays. The marker lists
the added tokens, which transformers otherwise reads by parsing all of ``tokenizer.json``
in Python (about 0.1 s for Qwen2.5's 6 MB).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from transformers import (
    GenerationConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.checkpoint import Checkpoint, CheckpointFormat
from hwplug.model_zoo.loaders.mapped import MappedFile
from hwplug.model_zoo.loaders.validate import TensorInfo, check_config, check_tensors

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
#: Weight files that hold pickles, which hwplug never loads.
PICKLE_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")
PLAIN_CONFIG_NAME = "hwplug_config.json"
#: Fields a plain config need not reproduce: one a plain ``PretrainedConfig`` drops and
#: hwplug does not read (a transformers generation setting), and the writer's version.
PLAIN_CONFIG_UNCOMPARED = frozenset({"use_cache", "transformers_version"})
PLAIN_TOKENIZER_NAME = "hwplug_tokenizer.json"
#: Texts a plain tokenizer must encode as its class does (with the special tokens joined).
TOKENIZER_PROBES = ("Hello, world!", "  two spaces,\ttabs\n\nand new lines \r\n",
                    "Ünïcödé: 中文, 😀, café, naïve", "def f(x):\n    return x ** 2  # code",
                    "1234567890 3.14159e-3 0x1F", "")
#: Tokenizer settings a plain tokenizer must share with its class.
TOKENIZER_SETTINGS = ("special_tokens_map", "all_special_ids", "chat_template",
                      "model_max_length", "padding_side", "truncation_side",
                      "clean_up_tokenization_spaces")


def load_hf_dir(directory: Path, *, source: Path | None = None,
                format: CheckpointFormat = "safetensors",
                mapped: tuple[MappedFile, ...] = ()) -> Checkpoint:
    """Load the model directory ``directory``.

    ``source`` and ``format`` are what the checkpoint reports (default: the directory, and
    ``"safetensors"``); the GGUF loader passes the ``.gguf`` file it converted and the
    files whose tensors are used in place (``mapped``, see :class:`Checkpoint`). The weight
    files' headers (and ``mapped``'s indexes) are read now and checked against the config
    (:mod:`.validate`: sizes positive and bounded, layers, heads and vocabulary as the
    tensors have them, no zero-sized tensor; end-of-sequence ids inside the vocabulary),
    so a truncated, corrupt or inconsistent checkpoint fails here, before a model is
    allocated. Raises :class:`ModelError` naming the directory or file and the problem.
    """
    weight_files = find_weight_files(directory)
    tensors: dict[str, TensorInfo] = {}
    for path in weight_files:
        for name, info in read_safetensors_header(path).items():
            if name in tensors:
                raise ModelError(f"tensor {name} is stored twice: in {tensors[name].file} "
                                 f"and in {path}")
            tensors[name] = info
    for file in mapped:
        for name, mapped_tensor in file.tensors.items():
            if name in tensors:
                raise ModelError(f"tensor {name} is stored twice: in {tensors[name].file} "
                                 f"and in {file.path}")
            tensors[name] = TensorInfo(mapped_tensor.shape, file.path)
    config = load_config(directory)
    where = str(source or directory)
    check_tensors(check_config(config, where), tensors, where)
    tokenizer = load_tokenizer(directory, config)
    generation_config = None
    if (directory / GENERATION_CONFIG_NAME).is_file():
        generation_config = from_pretrained(GenerationConfig, "generation config", directory)
    eos = eos_token_ids(config, generation_config, tokenizer)
    vocab_size = getattr(config, "vocab_size", None)
    outside = [i for i in eos if vocab_size is not None and not 0 <= i < vocab_size]
    if outside:
        raise ModelError(f"{where}: end-of-sequence token ids {outside} are outside the "
                         f"vocabulary (vocab_size {vocab_size})")
    logger.debug("loaded %s (%s) with %d weight files", directory, config.architectures,
                 len(weight_files))
    return Checkpoint(config=config, tokenizer=tokenizer, source=source or directory,
                      format=format, weight_files=weight_files,
                      generation_config=generation_config, eos_token_ids=eos, mapped=mapped)


def load_config(directory: Path) -> PretrainedConfig:
    """``directory``'s config: from :data:`PLAIN_CONFIG_NAME` as a plain ``PretrainedConfig``
    when the directory has one, else ``config.json`` through ``AutoConfig``. Raises
    :class:`ModelError` naming the file when it cannot be read."""
    plain = directory / PLAIN_CONFIG_NAME
    if not plain.is_file():
        from transformers import AutoConfig  # a plain config (the cached load) skips it

        return from_pretrained(AutoConfig, "config", directory)
    try:
        return PretrainedConfig.from_dict(json.loads(plain.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ModelError(f"cannot load the config from {plain}: {exc}") from exc


def save_config_and_tokenizer(config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase,
                              directory: Path) -> None:
    """Save ``config`` and ``tokenizer`` into ``directory`` for every reader
    (``save_pretrained``), and the plain forms a later :func:`load_hf_dir` reads where they
    reproduce them (:func:`write_plain_config`, :func:`write_plain_tokenizer`)."""
    config.save_pretrained(directory)
    write_plain_config(config, directory)
    tokenizer.save_pretrained(directory)
    write_plain_tokenizer(tokenizer, directory)


def write_plain_config(config: PretrainedConfig, directory: Path) -> bool:
    """Write ``config``'s fields to ``directory``/:data:`PLAIN_CONFIG_NAME` if a plain
    ``PretrainedConfig`` made from them has every field of ``config`` and every alias its
    class maps (``attribute_map``) with the same value (bar :data:`PLAIN_CONFIG_UNCOMPARED`);
    return whether it did. ``config.json`` is written apart (``save_pretrained``) for every
    other reader of the directory."""
    fields = json.loads(config.to_json_string(use_diff=False))
    plain = PretrainedConfig.from_dict(fields)
    names = (set(fields) | set(config.attribute_map)) - PLAIN_CONFIG_UNCOMPARED
    differ = sorted(name for name in names
                    if getattr(plain, name, None) != getattr(config, name, None))
    if differ:
        logger.debug("%s keeps its config class: a plain config differs in %s",
                      directory, ", ".join(differ))
        return False
    (directory / PLAIN_CONFIG_NAME).write_text(json.dumps(fields, indent=1, sort_keys=True))
    return True


def load_tokenizer(directory: Path,
                   config: PretrainedConfig | None) -> PreTrainedTokenizerBase:
    """``directory``'s tokenizer: a plain ``PreTrainedTokenizerFast`` when the directory has
    :data:`PLAIN_TOKENIZER_NAME` (given the added tokens it lists, so transformers does
    not parse the whole ``tokenizer.json`` in Python for them), else through
    ``AutoTokenizer`` (the class its ``tokenizer_config.json`` names). Raises
    :class:`ModelError` naming the directory."""
    marker = directory / PLAIN_TOKENIZER_NAME
    if marker.is_file():
        return from_pretrained(PreTrainedTokenizerFast, "tokenizer", directory,
                               **_added_tokens(marker))
    from transformers import AutoTokenizer  # a plain tokenizer (the cached load) skips it

    return from_pretrained(AutoTokenizer, "tokenizer", directory, config=config)


def write_plain_tokenizer(tokenizer: PreTrainedTokenizerBase, directory: Path) -> bool:
    """Write ``directory``/:data:`PLAIN_TOKENIZER_NAME` (with ``tokenizer``'s added tokens)
    if ``tokenizer``, already saved in ``directory``, loads from there as a plain
    ``PreTrainedTokenizerFast`` given those added tokens that has its vocabulary, added
    tokens and :data:`TOKENIZER_SETTINGS`, encodes :data:`TOKENIZER_PROBES` (and its special
    tokens) to the same ids and decodes every id to the same text; return whether it did."""
    added = {str(i): token.__getstate__() for i, token in tokenizer.added_tokens_decoder.items()}
    plain = from_pretrained(PreTrainedTokenizerFast, "tokenizer", directory,
                            added_tokens_decoder=added)
    differ = tokenizer_differences(tokenizer, plain)
    if differ:
        logger.debug("%s keeps its tokenizer class %s: a plain one differs in %s", directory,
                     type(tokenizer).__name__, ", ".join(differ))
        return False
    (directory / PLAIN_TOKENIZER_NAME).write_text(json.dumps(
        {"loads_as": "PreTrainedTokenizerFast", "saved_by": type(tokenizer).__name__,
         "added_tokens_decoder": added}))
    return True


def _added_tokens(marker: Path) -> dict[str, Any]:
    """``{"added_tokens_decoder": ...}`` as ``marker`` lists them (empty for a marker
    written before it listed them). Raises :class:`ModelError` for an unreadable one."""
    try:
        added = json.loads(marker.read_text()).get("added_tokens_decoder")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelError(f"cannot read {marker}: {exc}") from exc
    return {} if added is None else {"added_tokens_decoder": added}


def tokenizer_differences(tokenizer: PreTrainedTokenizerBase,
                          other: PreTrainedTokenizerBase) -> list[str]:
    """What of :func:`write_plain_tokenizer`'s comparison differs between ``tokenizer`` and
    ``other`` (empty: nothing)."""
    def added(tok: PreTrainedTokenizerBase) -> dict[int, Any]:
        return {i: token.__getstate__() for i, token in tok.added_tokens_decoder.items()}

    differ = [name for name in TOKENIZER_SETTINGS
              if getattr(tokenizer, name, None) != getattr(other, name, None)]
    if tokenizer.get_vocab() != other.get_vocab():
        differ.append("vocabulary")
    if added(tokenizer) != added(other):
        differ.append("added tokens")
    texts = [*TOKENIZER_PROBES, " ".join(tokenizer.all_special_tokens) + " Hi!"]
    for special in (True, False):
        if tokenizer(texts, add_special_tokens=special)["input_ids"] != other(
                texts, add_special_tokens=special)["input_ids"]:
            differ.append(f"encoding (add_special_tokens={special})")
        every_id = list(range(len(tokenizer)))
        if tokenizer.decode(every_id, skip_special_tokens=special) != other.decode(
                every_id, skip_special_tokens=special):
            differ.append(f"decoding (skip_special_tokens={special})")
    return differ


def find_weight_files(directory: Path) -> tuple[Path, ...]:
    """The safetensors files of ``directory`` (the shards in index order, or the one file).

    Raises :class:`ModelError` listing what is missing: ``config.json``, any safetensors
    weights (saying so when only pickle weights are there), or shards the index names.
    """
    problems = []
    if not (directory / CONFIG_NAME).is_file():
        problems.append(f"no {CONFIG_NAME}")
    files: tuple[Path, ...] = ()
    if (directory / WEIGHTS_INDEX_NAME).is_file():
        files = _shards(directory / WEIGHTS_INDEX_NAME)
        problems += [f"no shard {path.name} (named in {WEIGHTS_INDEX_NAME})"
                     for path in files if not path.is_file()]
    elif (directory / WEIGHTS_NAME).is_file():
        files = (directory / WEIGHTS_NAME,)
    else:
        pickles = sorted(path.name for pattern in PICKLE_WEIGHT_PATTERNS
                         for path in directory.glob(pattern))
        problems.append(
            f"only pickle weights ({', '.join(pickles)}), which hwplug does not load: "
            f"safetensors is required (convert with transformers' save_pretrained)" if pickles
            else f"no weights ({WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME} with its shards)")
    if problems:
        raise ModelError(f"{directory} is not a loadable model directory: "
                         f"{'; '.join(problems)}")
    return files


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """The shape of every tensor in ``path``, read from its header (no tensor data).

    Raises :class:`ModelError` naming the file when it is truncated or corrupt.
    """
    try:
        with safe_open(path, framework="pt") as file:
            return {name: TensorInfo(tuple(file.get_slice(name).get_shape()), path)
                    for name in file.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelError(f"{path} is not a readable safetensors file (truncated or "
                         f"corrupt?): {exc}") from exc


def eos_token_ids(config: PretrainedConfig, generation_config: GenerationConfig | None,
                  tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The end-of-sequence ids: the generation config's, else the model config's, else the
    tokenizer's; empty when none has one (an encoder)."""
    for holder in (generation_config, config):
        ids = getattr(holder, "eos_token_id", None)
        if ids is not None:
            return tuple(ids) if isinstance(ids, list | tuple) else (int(ids),)
    return () if tokenizer.eos_token_id is None else (int(tokenizer.eos_token_id),)


def _shards(index: Path) -> tuple[Path, ...]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        return tuple(index.parent / name for name in dict.fromkeys(weight_map.values()))
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise ModelError(f"{index} is not a valid safetensors index (a JSON object with a "
                         f"'weight_map' of tensor name -> shard file): {exc}") from exc


def from_pretrained(cls: Any, what: str, directory: Path, **kwargs: Any) -> Any:
    """``cls.from_pretrained(directory, local_files_only=True, **kwargs)``, with any failure
    turned into a :class:`ModelError` naming ``what`` and the file or directory read."""
    # transformers and tokenizers raise many types (OSError, ValueError, JSON and Rust
    # errors) for an unreadable file, so every exception is translated.
    try:
        return cls.from_pretrained(directory, local_files_only=True, **kwargs)
    except Exception as exc:
        location = directory / kwargs["gguf_file"] if "gguf_file" in kwargs else directory
        raise ModelError(f"cannot load the {what} from {location}: {exc}") from exc
