"""``load_checkpoint``: load a model named as :func:`~.resolve.resolve_model` accepts."""

from __future__ import annotations

import os

from hwplug.errors import ConfigError
from hwplug.model_zoo.loaders.checkpoint import Checkpoint
from hwplug.model_zoo.loaders.gguf_file import load_gguf
from hwplug.model_zoo.loaders.hf_dir import load_hf_dir
from hwplug.model_zoo.loaders.resolve import checkpoint_format, resolve_model


def load_checkpoint(model: str | os.PathLike[str] | None = None,
                    dequantize: bool = False) -> Checkpoint:
    """Load ``model``: a path returned by :func:`resolve_model` (a ``.gguf`` file or a
    Hugging Face directory), or anything that function accepts (an alias, ``None``).

    A GGUF is converted into the cache on its first load (seconds) and read from there
    afterwards (well under a second), its weights kept in their GGUF blocks or, with
    ``dequantize``, as float32; a directory is read in place (``dequantize`` is then a
    :class:`~hwplug.errors.ConfigError`: its weights load as their config says). Raises
    :class:`~hwplug.errors.ModelError` naming the file and the problem when the model is
    missing, of another kind, truncated or corrupt, or lacks config.json or safetensors
    weights.
    """
    path = resolve_model(model)
    if checkpoint_format(path) == "gguf":
        return load_gguf(path, dequantize)
    if dequantize:
        raise ConfigError(f"dequantize applies to GGUF files; {path} is a Hugging Face "
                          "directory, loaded as its config says")
    return load_hf_dir(path)
