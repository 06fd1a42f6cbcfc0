"""Random GGUF-quantized weights for the ``ggml_*`` ops' inputs: rows of blocks as a GGUF
file stores them (see ``hwplug.kernel_registry.reference.ggml`` for the layouts)."""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from hwplug.kernel_registry.reference.ggml import SCALE_FIELDS

#: The quantized GGUF types (``gguf.GGMLQuantizationType`` values) drawn.
GGML_TYPES = tuple(int(kind) for kind in SCALE_FIELDS)


def ggml_block(kind: int) -> int:
    """How many values one block of GGUF type ``kind`` holds (32, or 256 for K-quants)."""
    return GGML_QUANT_SIZES[GGMLQuantizationType(kind)][0]


def ggml_weight(rng: torch.Generator, kind: int, rows: int, cols: int) -> torch.Tensor:
    """``uint8 [rows, row_bytes]``: ``rows`` GGUF rows of ``cols`` values (a multiple of
    :func:`ggml_block`) of type ``kind`` (one of :data:`GGML_TYPES`), with random quants and
    scales of either sign, scaled together so that the weights' rms is ``cols ** -0.5``."""
    kind = GGMLQuantizationType(kind)
    block, size = GGML_QUANT_SIZES[kind]
    data = torch.randint(0, 256, (rows * cols // block, size), generator=rng, dtype=torch.uint8)
    fields = SCALE_FIELDS[kind]
    signs = torch.randint(0, 2, (len(fields), len(data)), generator=rng) * 2 - 1
    scales = (torch.rand(len(fields), len(data), generator=rng) + 0.5) * signs
    for rescale in (False, True):
        if rescale:  # the rms the first scales give, brought to cols ** -0.5
            values = quants.dequantize(data.view(rows, -1).numpy(), kind)
            scales *= cols ** -0.5 / float((values ** 2).mean() ** 0.5)
        for j, start in enumerate(fields):
            data[:, start:start + 2] = scales[j].half().view(torch.uint8).view(-1, 2)
    return data.view(rows, -1)
