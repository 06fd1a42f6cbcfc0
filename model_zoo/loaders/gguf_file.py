"""Loading a GGUF file: validate it, convert it once into the cache, load the cache after.

A conversion is a Hugging Face directory (``config.json``, the tokenizer files and one
``model.safetensors``) under ``HWPLUG_CACHE_DIR/<kind>/<key>`` (see :mod:`.cache`), loaded
by :func:`~.hf_dir.load_hf_dir` on this and every later load; the config's fields are also
written as ``hwplug_config.json`` and a tokenizer its files reproduce is marked plain (see
:mod:`.hf_dir`): a cached load imports neither the config class nor ``AutoTokenizer``.

By default (kind ``gguf-blocks``) the weights stay as the file stores them and are used in
place: every matrix is ``<name>.qweight`` (``uint8 [rows, row_bytes]``, its GGUF blocks)
with ``<name>.qweight_type`` (its ``GGMLQuantizationType``), ``config.json`` names the
``gguf`` quant method (:mod:`hwplug.model_zoo.quant_methods.gguf`), and
:data:`GGUF_INDEX_NAME` lists, for every tensor the model can use as the file stores it
(matrices' blocks, float32 vectors), its offset in the ``.gguf``: the checkpoint hands
those out as views of the mapped file (:mod:`.mapped`), so the weights are resident once,
as the file's pages. Only what a conversion changes is written: the blocks of matrices
whose rows transformers' processor reorders (llama's Q/K permutation) to
:data:`REPACKED_NAME` (mapped the same way; the index gives their offsets and why they
were copied), the types and vectors not stored as float32 (held as float32) to
``model.safetensors``, so the entry is no larger than what was repacked.
With ``dequantize=True`` (kind ``gguf``) every tensor is dequantized to float32 into
``model.safetensors``.

Conversion reuses transformers' GGUF support: ``AutoConfig`` and ``AutoTokenizer`` with
``gguf_file`` build the config and the fast tokenizer, and transformers' per-architecture
tensor processors undo llama.cpp's layout changes (e.g. llama's Q/K row permutation). The
tensors are dequantised here, with ``gguf.quants.dequantize``, and named with one gguf
tensor-name map over the model's parameter names: transformers'
``load_gguf_checkpoint(return_tensors=True)`` does the same but rebuilds that map once per
submodule and parses the file a second time: about 14 s against 4 s for SmolLM2-135M. The
processors only move whole rows of matrices (llama's permutation), so kept blocks go
through them as ``[rows, row_bytes]`` arrays, unchanged within a row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gguf import (
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    ReaderTensor,
)
from gguf.quants import dequantize
from safetensors.torch import save_file

from hwplug.errors import ModelError
from hwplug.kernel_registry.reference.ggml import nonfinite_scales
from hwplug.model_zoo.loaders import cache
from hwplug.model_zoo.loaders import gguf_deepseek as deepseek
from hwplug.model_zoo.loaders.checkpoint import Checkpoint, from_pretrained
from hwplug.model_zoo.loaders.gguf_experts import ExpertBlocks, complete_config
from hwplug.model_zoo.loaders.gguf_names import causal_lm_skeleton, gguf_to_transformers_names
from hwplug.model_zoo.loaders.hf_dir import (
    WEIGHTS_NAME,
    load_hf_dir,
    save_config_and_tokenizer,
)
from hwplug.model_zoo.loaders.mapped import MappedFile, MappedTensor
from hwplug.model_zoo.loaders.validate import (
    TensorInfo,
    check_data_ranges,
    check_sizes,
    check_tensors,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)

#: Cache kinds: weights dequantized to float32, or kept in their GGUF blocks.
CACHE_KIND, BLOCKS_CACHE_KIND = "gguf", "gguf-blocks"
#: The GGUF metadata key (after ``<architecture>.``) of each size a config states.
GGUF_SIZE_KEYS = {
    "num_hidden_layers": "block_count", "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length", "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
    "max_position_embeddings": "context_length", "vocab_size": "vocab_size",
}
TOKENS_KEY = "tokenizer.ggml.tokens"
#: The index of a ``gguf-blocks`` entry: the tensors used in place from the ``.gguf`` and
#: from :data:`REPACKED_NAME`, and why those were copied.
GGUF_INDEX_NAME = "gguf_tensors.json"
#: The blocks a conversion reorders, back to back (each at a multiple of
#: :data:`REPACKED_ALIGNMENT` bytes).
REPACKED_NAME = "repacked.bin"
REPACKED_ALIGNMENT = 64


@dataclass
class ConvertedTensors:
    """A GGUF's tensors as a conversion splits them: ``written`` into ``model.safetensors``
    (by name), ``in_place`` (views of the ``.gguf``: name -> where the file holds it),
    ``repacked`` (blocks the conversion changed, ``uint8 [rows, row_bytes]``, for
    :data:`REPACKED_NAME`) and ``copied``: why each repacked tensor (and each float
    vector written rather than used in place) is not the file's own bytes."""

    written: dict[str, torch.Tensor] = field(default_factory=dict)
    in_place: dict[str, MappedTensor] = field(default_factory=dict)
    repacked: dict[str, np.ndarray] = field(default_factory=dict)
    copied: dict[str, str] = field(default_factory=dict)


def load_gguf(path: Path, dequantize: bool = False) -> Checkpoint:
    """Load the GGUF file ``path``, converting it into the cache on first use, its weights
    kept in their GGUF blocks (the ``gguf`` quant method) or, with ``dequantize``, float32.

    A cache entry that cannot be read is discarded (with a warning) and rebuilt. The file is
    validated before anything is written, so a corrupt or truncated file leaves no entry.
    Raises :class:`ModelError` naming the file and the problem.
    """
    entry = cache.entry_dir(path, CACHE_KIND if dequantize else BLOCKS_CACHE_KIND)
    if entry.is_dir():
        try:
            return _load_entry(entry, path, dequantize)
        except ModelError as exc:
            logger.warning("the cached conversion of %s is unreadable, rebuilding it: %s",
                           path, exc)
            cache.discard(entry)
    reader = read_gguf(path)
    check_gguf(path, reader)
    started = time.perf_counter()
    with cache.building(entry, source=path) as staging:
        convert_gguf(path, reader, staging, dequantize)
    logger.info("converted %s in %.1f s into %s", path, time.perf_counter() - started, entry)
    return _load_entry(entry, path, dequantize)


def _load_entry(entry: Path, path: Path, dequantize: bool) -> Checkpoint:
    """The checkpoint of cache ``entry`` of GGUF ``path``: a ``gguf-blocks`` entry's
    in-place tensors are views of ``path`` and of its :data:`REPACKED_NAME` (see
    :func:`read_index`)."""
    mapped = () if dequantize else read_index(entry, path)
    return load_hf_dir(entry, source=path, format="gguf", mapped=mapped)


def read_index(entry: Path, path: Path) -> tuple[MappedFile, ...]:
    """The :class:`MappedFile` of GGUF ``path``, then of ``entry``'s :data:`REPACKED_NAME`
    when it holds tensors, as ``entry``'s :data:`GGUF_INDEX_NAME` describes them. Raises
    :class:`ModelError` when the index is missing or malformed."""
    index = entry / GGUF_INDEX_NAME
    try:
        data = json.loads(index.read_text())
        files = [(path, data["gguf"]), (entry / REPACKED_NAME, data["repacked"])]
        return tuple(
            MappedFile(file, int(part["size"]), {
                name: MappedTensor(int(offset), str(dtype), tuple(int(n) for n in shape))
                for name, (offset, dtype, shape) in part["tensors"].items()},
                {str(k): str(v) for k, v in part["copied"].items()})
            for file, part in files if part["tensors"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelError(f"cannot read the tensor index {index}: {exc}") from exc


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


def check_gguf(path: Path, reader: GGUFReader) -> None:
    """Check ``path``'s metadata and tensor table before anything is converted or allocated.

    The sizes the metadata states (``<architecture>.block_count``, ``.embedding_length``,
    heads, context length, vocabulary: :data:`GGUF_SIZE_KEYS`; the vocabulary also as the
    number of tokenizer tokens) go through :func:`~.validate.check_sizes`, and the tensors
    (``blk.N.*``, ``token_embd``, ``attn_q``/``attn_k``) through
    :func:`~.validate.check_tensors`: a ``block_count`` other than the number of layers
    the tensors have, 10**7 layers, or a tokenizer of another size than the embedding fail
    here. Raises :class:`ModelError` naming the file and the problem.
    """
    architecture = gguf_architecture(path, reader)
    sizes = {name: value for name, key in GGUF_SIZE_KEYS.items()
             if (value := _field(path, reader, f"{architecture}.{key}")) is not None}
    tokens = reader.fields.get(TOKENS_KEY)
    if tokens is not None:
        count = len(tokens.data) if tokens.types[:1] == [GGUFValueType.ARRAY] else None
        if count is None or sizes.setdefault("vocab_size", count) != count:
            raise ModelError(f"{path}: {TOKENS_KEY} holds {count} tokens, but "
                             f"{architecture}.vocab_size is {sizes['vocab_size']!r}")
    tensors = {t.name: TensorInfo(tuple(int(n) for n in reversed(t.shape)), path)
               for t in reader.tensors}
    check_tensors(check_sizes(sizes, str(path)), tensors, str(path))
    check_data_ranges(path, reader)


def gguf_architecture(path: Path, reader: GGUFReader) -> str:
    """The file's ``general.architecture`` (e.g. ``"llama"``); :class:`ModelError` if it has
    none."""
    architecture = _field(path, reader, "general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise ModelError(f"{path}: general.architecture is {architecture!r}, not the name of "
                         "a GGUF architecture")
    return architecture


def _field(path: Path, reader: GGUFReader, key: str) -> Any:
    """The value of metadata ``key`` (None when absent); :class:`ModelError` when it cannot
    be decoded."""
    field = reader.fields.get(key)
    try:
        return None if field is None else field.contents()
    except (ValueError, IndexError) as exc:
        raise ModelError(f"{path}: metadata {key} cannot be decoded: {exc}") from exc


def convert_gguf(path: Path, reader: GGUFReader, out: Path, dequantize: bool = True) -> None:
    """Write ``path`` (already parsed as ``reader``) into ``out`` as a Hugging Face directory:
    ``config.json`` (with ``architectures`` set), the tokenizer files and the weights in
    transformers naming, dequantised to float32 or kept in blocks, those used in place
    listed in :data:`GGUF_INDEX_NAME` (see the module docstring). Raises
    :class:`ModelError` for an architecture or a quantisation type transformers or gguf
    cannot handle."""
    # conversion only: a cached load skips these imports
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    if gguf_architecture(path, reader) == deepseek.ARCHITECTURE:  # transformers reads none
        config, tokenizer_class = deepseek.deepseek_config(reader, path), PreTrainedTokenizerFast
    else:
        config = from_pretrained(AutoConfig, "config", path.parent, gguf_file=path.name)
        config, tokenizer_class = complete_config(config, reader), AutoTokenizer
    tokenizer = from_pretrained(tokenizer_class, "tokenizer", path.parent, gguf_file=path.name)
    model_class, parameter_names = causal_lm_skeleton(config, path)
    config.architectures = config.architectures or [model_class]
    tensors = converted_tensors(path, reader, config, parameter_names, dequantize)
    if not dequantize:
        config.quantization_config = {"quant_method": "gguf"}
        write_index(out, path.stat().st_size, tensors)
    save_config_and_tokenizer(config, tokenizer, out)
    save_file(tensors.written, out / WEIGHTS_NAME,
              metadata={"format": "pt", "source": str(path)})


def write_index(out: Path, size: int, tensors: ConvertedTensors) -> None:
    """Write ``tensors.repacked`` to ``out``/:data:`REPACKED_NAME` and the index of it and
    of the GGUF's in-place tensors (the GGUF is ``size`` bytes) to
    ``out``/:data:`GGUF_INDEX_NAME`."""
    def entries(tensors: dict[str, MappedTensor]) -> dict[str, list[Any]]:
        return {name: [t.offset, t.dtype, list(t.shape)] for name, t in tensors.items()}

    repacked, offset = {}, 0
    with open(out / REPACKED_NAME, "wb") as file:
        for name, rows in tensors.repacked.items():
            offset = -(-offset // REPACKED_ALIGNMENT) * REPACKED_ALIGNMENT
            file.seek(offset)
            file.write(rows.tobytes())
            repacked[name] = MappedTensor(offset, "uint8", tuple(rows.shape))
            offset += rows.nbytes
    index = {"gguf": {"size": size, "tensors": entries(tensors.in_place), "copied": {}},
             "repacked": {"size": offset, "tensors": entries(repacked),
                          "copied": {name: tensors.copied[name] for name in repacked}}}
    (out / GGUF_INDEX_NAME).write_text(json.dumps(index, indent=0))


def converted_tensors(path: Path, reader: GGUFReader, config: PretrainedConfig,
                      parameter_names: Iterable[str], dequantize_all: bool
                      ) -> ConvertedTensors:
    """Every tensor of ``reader`` that maps to one of ``parameter_names``, un-permuted by
    transformers' processor for the file's architecture and keyed by its transformers
    name: dequantised to float32 and written, or, unless ``dequantize_all``, matrices kept
    in their blocks and float32 vectors as they are: in place where the processor left
    them as the file stores them, else repacked (blocks) or written (floats), with the
    reason. Tensors with no parameter (e.g. precomputed rope factors) are skipped."""
    architecture = gguf_architecture(path, reader)
    names = gguf_to_transformers_names(architecture, parameter_names, config.num_hidden_layers)
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    # Processors that merge or split tensors (MoE experts) store them in parsed["tensors"].
    parsed: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}
    converted = ConvertedTensors(written=parsed["tensors"])
    skipped, experts = [], ExpertBlocks()
    latent = deepseek.LatentUpProjection(config.num_attention_heads)
    for tensor in reader.tensors:
        bad = nonfinite_scales(tensor.data, tensor.tensor_type)
        if bad:
            raise ModelError(f"{path}: tensor {tensor.name} ({tensor.tensor_type.name}) has "
                             f"{bad} NaN or infinite block scales")
        if experts.take(tensor, names, converted, dequantize_all) or \
                latent.take(tensor, converted, dequantize_all):
            continue
        try:
            matrix = not dequantize_all and len(tensor.shape) == 2
            as_stored = matrix or (not dequantize_all and tensor.tensor_type ==
                                   GGMLQuantizationType.F32)
            weights = tensor.data if as_stored else dequantize(tensor.data,
                                                               tensor.tensor_type)
            result = processor.process(weights=weights, name=tensor.name,
                                       tensor_key_mapping=names, parsed_parameters=parsed)
            if result.name not in names:
                if result.name is not None:
                    skipped.append(tensor.name)
                continue
            name = names[result.name]
            if matrix:
                converted.written.update(_type(name, tensor.tensor_type))
            if as_stored and _unchanged(result.weights, tensor):
                converted.in_place.update(_in_place(name, tensor, matrix))
            elif matrix:
                qweight = f"{name.removesuffix('.weight')}.qweight"
                converted.repacked[qweight] = _rows(result.weights)
                converted.copied[qweight] = f"{type(processor).__name__} reorders its rows"
            else:
                converted.written[name] = torch.from_numpy(
                    np.array(result.weights, dtype=np.float32))
                if not dequantize_all:
                    converted.copied[name] = (
                        f"a {tensor.tensor_type.name} vector, held as float32"
                        if tensor.tensor_type != GGMLQuantizationType.F32
                        else f"{type(processor).__name__} changes its values")
        except NotImplementedError as exc:
            raise ModelError(f"{path}: tensor {tensor.name} is stored as "
                             f"{tensor.tensor_type.name}, which gguf cannot dequantise") from exc
        except Exception as exc:  # gguf and the processors raise many types on bad data
            raise ModelError(f"{path}: tensor {tensor.name} cannot be dequantised: "
                             f"{exc!r}") from exc
    experts.check_done()
    latent.check_done()
    if skipped:
        logger.info("%s: %d tensors have no %s parameter and are skipped: %s", path,
                    len(skipped), config.architectures[0], ", ".join(skipped))
    return converted


def _unchanged(weights: Any, tensor: ReaderTensor) -> bool:
    """Whether ``weights`` (a processor's result) are ``tensor``'s data as the file holds
    it: the same C-contiguous memory and number of rows."""
    return (isinstance(weights, np.ndarray) and weights.flags.c_contiguous
            and weights.ctypes.data == tensor.data.ctypes.data
            and weights.nbytes == tensor.data.nbytes and len(weights) == len(tensor.data))


def _in_place(name: str, tensor: ReaderTensor, matrix: bool) -> dict[str, MappedTensor]:
    """Where the file holds parameter ``name``: a matrix's blocks as ``name.qweight``
    (``uint8 [rows, row_bytes]``), a float32 vector as itself."""
    offset = int(tensor.data_offset)
    if not matrix:
        return {name: MappedTensor(offset, "float32", (int(tensor.data.size),))}
    rows = len(tensor.data)
    return {f"{name.removesuffix('.weight')}.qweight":
            MappedTensor(offset, "uint8", (rows, int(tensor.n_bytes) // rows))}


def _type(name: str, kind: int) -> dict[str, torch.Tensor]:
    """``{name.qweight_type: int32 [1]}``: the type of the matrix parameter ``name``
    (``*.weight``), whose rows are ``name.qweight`` in place or repacked."""
    return {f"{name.removesuffix('.weight')}.qweight_type":
            torch.tensor([int(kind)], dtype=torch.int32)}


def _rows(rows: np.ndarray) -> np.ndarray:
    """GGUF rows (blocks as bytes, or float values for F32 / F16 / BF16 matrices, whose
    bytes are their blocks) as C-contiguous ``uint8 [rows, row_bytes]``."""
    data = np.ascontiguousarray(rows)
    return data.view(np.uint8).reshape(len(data), -1)
