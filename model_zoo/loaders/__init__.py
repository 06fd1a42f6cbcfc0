"""Checkpoint loading for the model zoo.

``load_checkpoint(name)`` (or ``load_checkpoint(resolve_model(name))``) gives a
:class:`Checkpoint`: the transformers config (``architectures`` set), a fast tokenizer, the
end-of-sequence ids, and ``weights()`` in transformers naming. ``name`` is an alias
(``smollm2``, the default; ``all-minilm-l6-v2``), a ``.gguf`` file or a Hugging Face
directory with safetensors weights. GGUF files are converted once into
``HWPLUG_CACHE_DIR``, their weights kept in GGUF blocks (or dequantised, on request). A model that is missing or unreadable raises
:class:`~hwplug.errors.ModelError`; an unwritable cache directory raises
:class:`~hwplug.errors.ConfigError`.
"""

from hwplug.model_zoo.loaders.checkpoint import Checkpoint
from hwplug.model_zoo.loaders.load import load_checkpoint
from hwplug.model_zoo.loaders.resolve import ALIASES, DEFAULT_MODEL, resolve_model

__all__ = ["ALIASES", "DEFAULT_MODEL", "Checkpoint", "load_checkpoint", "resolve_model"]
