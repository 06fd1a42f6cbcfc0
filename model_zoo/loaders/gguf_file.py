"""Loading a GGUF file: validate it, convert it once into the cache, load the cache after.

A conversion is a Hugging Face directory (``config.json``, the tokenizer files and one float32
``model.safetensors``) under ``HWPLUG_CACHE_DIR/gguf/<key>`` (see :mod:`.cache`), loaded by
:func:`~.hf_dir.load_hf_dir` on this and every later load.

Conversion reuses transformers' GGUF support: ``AutoConfig`` and ``AutoTokenizer`` with
``gguf_file`` build the config and the fast tokenizer, and transformers' per-architecture
tensor processors undo llama.cpp's layout changes (e.g. llama's Q/K row permutation). The
tensors are dequantised here, with ``gguf.quants.dequantize``, and named with one gguf
tensor-name map over the model's parameter names: transformers'
``load_gguf_checkpoint(return_tensors=True)`` does the same but rebuilds that map once per
submodule and parses the file a second time: about 14 s against 4 s for SmolLM2-135M.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGUFReader, get_tensor_name_map
from gguf.quants import dequantize
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

from hwplug.errors import ModelError
from hwplug.model_zoo.loaders import cache
from hwplug.model_zoo.loaders.checkpoint import Checkpoint
from hwplug.model_zoo.loaders.hf_dir import WEIGHTS_NAME, from_pretrained, load_hf_dir

logger = logging.getLogger(__name__)

CACHE_KIND = "gguf"


def load_gguf(path: Path) -> Checkpoint:
    """Load the GGUF file ``path``, converting it into the cache on first use.

    A cache entry that cannot be read is discarded (with a warning) and rebuilt. The file is
    validated before anything is written, so a corrupt or truncated file leaves no entry.
    Raises :class:`ModelError` naming the file and the problem.
    """
    entry = cache.entry_dir(path, CACHE_KIND)
    if entry.is_dir():
        try:
            return load_hf_dir(entry, source=path, format="gguf")
        except ModelError as exc:
            logger.warning("the cached conversion of %s is unreadable, rebuilding it: %s",
                           path, exc)
            cache.discard(entry)
    reader = read_gguf(path)
    started = time.perf_counter()
    with cache.building(entry) as staging:
        convert_gguf(path, reader, staging)
    logger.info("converted %s in %.1f s into %s", path, time.perf_counter() - started, entry)
    return load_hf_dir(entry, source=path, format="gguf")


def read_gguf(path: Path) -> GGUFReader:
    """Parse ``path``'s header and tensor table, checking every tensor lies inside the file.

    Raises :class:`ModelError` for a file that is not GGUF, has a corrupt header or is
    truncated.
    """
    try:
        return GGUFReader(path)
    except (OSError, ValueError, IndexError) as exc:
        raise ModelError(f"{path} is not a readable GGUF file (corrupt header or truncated "
                         f"tensor data): {exc}") from exc


def convert_gguf(path: Path, reader: GGUFReader, out: Path) -> None:
    """Write ``path`` (already parsed as ``reader``) into ``out`` as a Hugging Face directory:
    ``config.json`` (with ``architectures`` set), the tokenizer files and the dequantised
    float32 weights in transformers naming. Raises :class:`ModelError` for an architecture
    or a quantisation type transformers or gguf cannot handle."""
    config = from_pretrained(AutoConfig, "config", path.parent, gguf_file=path.name)
    tokenizer = from_pretrained(AutoTokenizer, "tokenizer", path.parent, gguf_file=path.name)
    model_class, parameter_names = _causal_lm_skeleton(config, path)
    config.architectures = config.architectures or [model_class]
    tensors = dequantised_tensors(path, reader, config, parameter_names)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    save_file(tensors, out / WEIGHTS_NAME, metadata={"format": "pt", "source": str(path)})


def dequantised_tensors(path: Path, reader: GGUFReader, config: PretrainedConfig,
                        parameter_names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Every tensor of ``reader`` that maps to one of ``parameter_names``, dequantised to
    float32 and un-permuted by transformers' processor for the file's architecture, keyed by
    its transformers name. Tensors with no parameter (e.g. precomputed rope factors) are
    skipped."""
    architecture = str(reader.fields["general.architecture"].contents())
    names = gguf_to_transformers_names(architecture, parameter_names, config.num_hidden_layers)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    # Processors that merge or split tensors (MoE experts) store them in parsed["tensors"].
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}
    skipped = []
    for tensor in reader.tensors:
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as exc:
            raise ModelError(f"{path}: tensor {tensor.name} is stored as "
                             f"{tensor.tensor_type.name}, which gguf cannot dequantise") from exc
        result = processor.process(weights=weights, name=tensor.name, tensor_key_mapping=names,
                                   parsed_parameters=parsed)
        if result.name in names:
            parsed["tensors"][names[result.name]] = torch.from_numpy(
                np.array(result.weights, dtype=np.float32))
        elif result.name is not None:
            skipped.append(tensor.name)
    if skipped:
        logger.info("%s: %d tensors have no %s parameter and are skipped: %s", path,
                    len(skipped), config.architectures[0], ", ".join(skipped))
    return parsed["tensors"]


def gguf_to_transformers_names(architecture: str, parameter_names: Iterable[str],
                               num_layers: int) -> dict[str, str]:
    """``{gguf tensor name: transformers parameter name}`` for a model of the GGUF
    ``architecture`` (e.g. ``"llama"``) with these parameters."""
    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ModelError(f"the installed gguf package does not know the GGUF architecture "
                         f"{architecture!r}")
    name_map = get_tensor_name_map(arch, num_layers)
    mapping = {}
    for parameter in parameter_names:
        gguf_name = name_map.get_name(parameter, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None:
            mapping[gguf_name] = parameter
    return mapping


def _causal_lm_skeleton(config: PretrainedConfig, path: Path) -> tuple[str, list[str]]:
    """The name and parameter names of ``config``'s transformers causal-LM class, built on
    the meta device (no memory used)."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except ValueError as exc:
        raise ModelError(f"{path}: transformers has no causal-LM class for model type "
                         f"{config.model_type!r}: {exc}") from exc
    return type(model).__name__, list(model.state_dict())
