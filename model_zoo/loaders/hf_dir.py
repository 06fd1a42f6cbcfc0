"""Loading a Hugging Face model directory: ``config.json``, tokenizer files, safetensors weights.

Weights must be safetensors (``model.safetensors``, or ``model.safetensors.index.json`` and its
shards): pickle checkpoints (``pytorch_model.bin``, ``*.pt``) are refused, never unpickled.
Nothing is fetched from the network: every transformers call gets ``local_files_only=True``.

A directory hwplug converted (see :mod:`.gguf_file`) may also hold the plain forms of its
config and tokenizer (:mod:`.plain_config`, :mod:`.plain_tokenizer`), which load without
importing transformers; a load that uses both imports none of it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.checkpoint import Checkpoint, CheckpointFormat, from_pretrained
from hwplug.model_zoo.loaders.mapped import MappedFile
from hwplug.model_zoo.loaders.plain_config import (
    PLAIN_CONFIG_NAME,
    PlainConfig,
    read_plain_config,
    write_plain_config,
)
from hwplug.model_zoo.loaders.plain_tokenizer import PlainTokenizer, write_plain_tokenizer
from hwplug.model_zoo.loaders.validate import TensorInfo, check_config, check_tensors

if TYPE_CHECKING:
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
#: Weight files that hold pickles, which hwplug never loads.
PICKLE_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt")


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
        from transformers import GenerationConfig

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


def load_config(directory: Path) -> PretrainedConfig | PlainConfig:
    """``directory``'s config: a :class:`PlainConfig` when the directory has
    :data:`PLAIN_CONFIG_NAME`, else ``config.json`` through ``AutoConfig``. Raises
    :class:`ModelError` naming the file when it cannot be read."""
    plain = directory / PLAIN_CONFIG_NAME
    if plain.is_file():
        return read_plain_config(plain)
    from transformers import AutoConfig

    return from_pretrained(AutoConfig, "config", directory)


def save_config_and_tokenizer(config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase,
                              directory: Path) -> None:
    """Save ``config`` and ``tokenizer`` into ``directory`` for every reader
    (``save_pretrained``), and the plain forms a later :func:`load_hf_dir` reads where they
    reproduce them (:func:`.write_plain_config`, :func:`.write_plain_tokenizer`)."""
    config.save_pretrained(directory)
    write_plain_config(config, directory)
    tokenizer.save_pretrained(directory)
    write_plain_tokenizer(tokenizer, directory)


def load_tokenizer(directory: Path, config: PretrainedConfig | PlainConfig | None
                   ) -> PreTrainedTokenizerBase | PlainTokenizer:
    """``directory``'s tokenizer: a :class:`PlainTokenizer` when the directory has its
    marker, else through ``AutoTokenizer`` (the class its ``tokenizer_config.json`` names).
    Raises :class:`ModelError` naming the directory."""
    plain = PlainTokenizer.from_marker(directory)
    if plain is not None:
        return plain
    from transformers import AutoTokenizer

    if isinstance(config, PlainConfig):  # AutoTokenizer reads config.json itself
        config = None
    return from_pretrained(AutoTokenizer, "tokenizer", directory, config=config)


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
