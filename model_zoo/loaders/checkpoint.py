"""``Checkpoint``: a loaded model's config and tokenizer, with its weights read on demand;
:func:`from_pretrained`: a transformers object read from a checkpoint's files."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from safetensors import SafetensorError, safe_open

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders.mapped import MappedFile
from hwplug.model_zoo.loaders.plain_config import PlainConfig

if TYPE_CHECKING:
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

    from hwplug.model_zoo.loaders.plain_tokenizer import PlainTokenizer

#: How the checkpoint was stored: a GGUF file or a directory of safetensors files.
CheckpointFormat = Literal["gguf", "safetensors"]


@dataclass(frozen=True)
class Checkpoint:
    """What a model needs to be built, tokenise its input and stop generating.

    - ``config``: the transformers config; ``config.architectures[0]`` names the model class
      (always set for a GGUF, as the file's causal-LM class, e.g. ``LlamaForCausalLM``).
      For a GGUF it is a :class:`~.plain_config.PlainConfig` holding every field of the
      architecture's config; :meth:`transformers_config` gives the architecture's class,
      which transformers' ``AutoModel`` classes need.
    - ``tokenizer``: a fast transformers tokenizer (with the chat template where the
      checkpoint ships one) or, for a GGUF, a :class:`~.plain_tokenizer.PlainTokenizer`
      that behaves as one.
    - ``source``: the ``.gguf`` file or the directory that was loaded.
    - ``format``: ``"gguf"`` (converted once, read from the conversion cache and, for
      blocks used as stored, from the ``.gguf`` itself) or ``"safetensors"`` (a Hugging
      Face directory, weights read in place).
    - ``weight_files``: the safetensors files :meth:`weights` reads, in order.
    - ``generation_config``: from ``generation_config.json`` when the checkpoint has one.
    - ``eos_token_ids``: the tokens that end a generation; empty for an encoder.
    - ``mapped``: files whose tensors :meth:`weights` gives as views of their mapping (a
      GGUF's blocks, see :mod:`.mapped`), after those of ``weight_files``.
    """

    config: PretrainedConfig | PlainConfig
    tokenizer: PreTrainedTokenizerBase | PlainTokenizer
    source: Path
    format: CheckpointFormat
    weight_files: tuple[Path, ...]
    generation_config: GenerationConfig | None = None
    eos_token_ids: tuple[int, ...] = ()
    mapped: tuple[MappedFile, ...] = ()

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file :meth:`weights` reads: ``weight_files``, then the mapped files."""
        return self.weight_files + tuple(mapped.path for mapped in self.mapped)

    def transformers_config(self) -> PretrainedConfig:
        """``config`` as an instance of its architecture's transformers config class (e.g.
        ``LlamaConfig``), the same fields; ``config`` itself when it is one already."""
        from transformers import AutoConfig

        if not isinstance(self.config, PlainConfig):
            return self.config
        fields = self.config.to_dict()
        return AutoConfig.for_model(fields.pop("model_type"), **fields)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(parameter name, tensor)`` for every tensor of every weight file.

        Names are the transformers names of ``config.architectures[0]`` for a GGUF (a tied
        ``lm_head.weight`` is absent) and the names stored in the file for a directory.
        Tensors are read in their stored dtype (float32 for a dequantised GGUF); those of
        ``mapped`` are views of the mapped files, which a caller may keep instead of copying
        (they are read-only in effect: a write stays private to the process). Each call
        starts over. Raises :class:`ModelError` naming the file (and the tensor) when one
        cannot be read.
        """
        for path in self.weight_files:
            try:
                file = safe_open(path, framework="pt")
            except (SafetensorError, OSError) as exc:
                raise ModelError(f"cannot read the weights in {path}: {exc}") from exc
            with file:
                for name in file.keys():
                    yield name, _read_tensor(file, path, name)
        for mapped in self.mapped:
            yield from mapped.views()


def _read_tensor(file: Any, path: Path, name: str) -> torch.Tensor:
    try:
        return file.get_tensor(name)
    except Exception as exc:  # safetensors raises its own errors, TypeError, ValueError...
        raise ModelError(f"cannot read tensor {name} from {path}: {exc!r}") from exc


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
