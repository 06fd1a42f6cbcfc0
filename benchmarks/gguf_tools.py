"""GGUF file helpers for ``benchmarks/make_gguf.py``: write a GGUF tensor by tensor, an F16
copy of a quantised GGUF, llama.cpp's quantizer, a copy with another context length, and a
file's tensor types. Nothing here prints; errors raise.
"""

from __future__ import annotations

import ctypes
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType
from gguf.quants import dequantize


def write_f16_copy(source: Path, out: Path) -> None:
    """Write ``source`` (any GGUF gguf can dequantise) to ``out`` with every matrix in F16
    and vectors in F32, the metadata kept but ``general.file_type`` (now MOSTLY_F16)."""
    reader = GGUFReader(source)
    arch = reader.get_field(Keys.General.ARCHITECTURE).contents()
    writer = GGUFWriter(out, arch)
    skip = (Keys.General.ARCHITECTURE, Keys.General.ALIGNMENT, Keys.General.FILE_TYPE)
    for field in reader.fields.values():
        if field.name in skip or field.name.startswith("GGUF."):
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    shapes = [tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors]
    for tensor, dims in zip(reader.tensors, shapes, strict=True):
        dtype = np.dtype(np.float16 if len(dims) == 2 else np.float32)
        writer.add_tensor_info(tensor.name, dims, dtype, int(tensor.n_elements) * dtype.itemsize)
    write_tensors(writer, (
        dequantize(t.data, t.tensor_type).reshape(dims).astype(
            np.float16 if len(dims) == 2 else np.float32)
        for t, dims in zip(reader.tensors, shapes, strict=True)))


def write_tensors(writer: GGUFWriter, tensors: Iterable[np.ndarray]) -> None:
    """Write ``writer``'s header, metadata and tensor table (every tensor's info added
    already), then each tensor as ``tensors`` yields it (in the table's order), so only one
    is in memory at a time; close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in tensors:
        writer.write_tensor_data(tensor)
    writer.close()


def quantize(source: Path, out: Path, type_name: str, threads: int) -> None:
    """Quantise the F16 GGUF ``source`` into ``out`` as llama.cpp's ``type_name`` file type
    (``llama_model_quantize`` with its default parameters, at most 1 GiB of rows in memory).
    Raises RuntimeError when llama.cpp reports a failure."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    params.nthread = threads
    params.max_buf_size = 1 << 30
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                            ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize({source.name} -> {type_name}) "
                           f"returned {status}")


def context_copy(path: Path, context: int, force: bool) -> Path:
    """``<path stem>.ctx<context>.gguf`` beside ``path``: a byte copy of it with
    ``<arch>.context_length`` set to ``context`` (in place in the copy, as gguf's
    ``gguf_set_metadata.py`` does). An existing copy is kept unless ``force``."""
    target = path.with_name(f"{path.stem}.ctx{context}.gguf")
    if target.exists() and not force:
        return target
    staging = target.with_name(f".{target.name}.tmp")
    shutil.copyfile(path, staging)
    reader = GGUFReader(staging, "r+")
    arch = reader.get_field(Keys.General.ARCHITECTURE).contents()
    field = reader.get_field(Keys.LLM.CONTEXT_LENGTH.format(arch=arch))
    if field is None:
        raise ValueError(f"{path} has no {arch}.context_length")
    field.parts[field.data[0]][0] = context
    reader.data.flush()
    del reader, field
    staging.replace(target)
    return target


def type_counts(path: Path) -> str:
    """``"Q4_K x196, Q6_K x29, F32 x113"``: how many tensors of each type ``path`` holds."""
    counts = Counter(t.tensor_type.name for t in GGUFReader(path).tensors)
    return ", ".join(f"{name} x{count}" for name, count in counts.most_common())
