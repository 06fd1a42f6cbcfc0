"""An F32 copy of a GGUF file, for llama.cpp's dequantised row of ``cpu_vs_llamacpp.py``.

Every tensor is dequantised with ``gguf.quants.dequantize`` and written as F32 with
``gguf.GGUFWriter``; the metadata is copied as it is, except ``general.file_type`` (now
``ALL_F32``). The copy is written once into ``HWPLUG_CACHE_DIR/benchmarks`` under a name
that includes the source's size and mtime, through a temporary file renamed into place.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType
from gguf.quants import dequantize

from hwplug import envs

logger = logging.getLogger(__name__)

#: Fields the writer sets itself (the ``GGUF.*`` header fields are virtual).
WRITER_FIELDS = (Keys.General.ARCHITECTURE, Keys.General.ALIGNMENT, Keys.General.FILE_TYPE)


def f32_copy(source: Path) -> Path:
    """The F32 copy of ``source`` (written on the first call, reused after)."""
    stat = source.stat()
    target = (envs.HWPLUG_CACHE_DIR.expanduser() / "benchmarks"
              / f"{source.stem}-{stat.st_size}-{stat.st_mtime_ns}.F32.gguf")
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write_f32(GGUFReader(source), staging)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    logger.info("wrote %s", target)
    return target


def write_f32(reader: GGUFReader, out: Path) -> None:
    """Write ``reader``'s model to ``out`` with every tensor dequantised to F32, one
    tensor in memory at a time."""
    architecture = reader.get_field(Keys.General.ARCHITECTURE).contents()
    writer = GGUFWriter(out, architecture)
    for field in reader.fields.values():
        if field.name in WRITER_FIELDS or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(LlamaFileType.ALL_F32)
    # numpy order (the reader's ``shape`` is GGML's, innermost first)
    shapes = [tuple(int(n) for n in reversed(tensor.shape)) for tensor in reader.tensors]
    for tensor, shape in zip(reader.tensors, shapes, strict=True):
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32),
                               4 * int(tensor.n_elements), GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor, shape in zip(reader.tensors, shapes, strict=True):
        writer.write_tensor_data(dequantize(tensor.data, tensor.tensor_type).reshape(shape))
    writer.close()
