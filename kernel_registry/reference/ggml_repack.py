"""The repacked layout of Q4_K, Q5_K, Q6_K and IQ4_XS rows (the ``ggml_repack`` and
``ggml_linear_repacked`` and ``ggml_embedding_repacked`` ops), in pure torch.

A weight ``uint8 [N, row_bytes]`` of GGUF rows is repacked group by group: each group of
:data:`GROUP_ROWS` consecutive rows (the first ``N // 16 * 16`` rows; the rest stay as they
are) becomes, super-block by super-block, the 16 rows' 32-bit words interleaved: word
``w`` of row ``r`` at byte ``64 w + 4 r`` of the super-block's ``16 * block_bytes`` bytes
(Q6_K's 210-byte blocks end in a 2-byte ``d``: the 16 rows' ``d`` follow the words, row
``r``'s at ``64 * 52 + 2 r``). Group ``g``'s super-block ``s`` starts at byte
``(g * blocks_per_row + s) * 16 * block_bytes`` of the weight. The result has the rows'
shape and bytes, only their order differs; :func:`unpack` gives the rows back.
"""

from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.ggml import ggml_embedding, ggml_linear, type_name

#: Rows per repacked group.
GROUP_ROWS = 16
#: The GGUF types the layout is defined for.
REPACKED_TYPES = frozenset(int(GGMLQuantizationType[name])
                           for name in ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS"))


def _groups(qweight: torch.Tensor, ggml_type: int) -> tuple[int, int, int]:
    """``(grouped rows, blocks per row, block bytes)`` of ``qweight``, checked."""
    if ggml_type not in REPACKED_TYPES:
        raise UnsupportedError(f"GGUF type {type_name(ggml_type)} has no repacked layout "
                               f"(repacked: {', '.join(type_name(t) for t in sorted(REPACKED_TYPES))})")
    size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)][1]
    if qweight.dtype != torch.uint8 or qweight.dim() != 2 or qweight.shape[1] % size:
        raise UnsupportedError(f"needs uint8 [N, row_bytes] rows of whole {size}-byte "
                               f"{type_name(ggml_type)} blocks, got {qweight.dtype} "
                               f"{list(qweight.shape)}")
    return qweight.shape[0] // GROUP_ROWS * GROUP_ROWS, qweight.shape[1] // size, size


def repack(qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The ``ggml_repack`` op: ``qweight`` (GGUF rows) in the repacked layout (see the
    module docstring), a new tensor of its shape."""
    grouped, blocks, size = _groups(qweight, ggml_type)
    words = size // 4
    out = qweight.clone()
    # [groups, 16 rows, blocks, bytes] -> [groups, blocks, 16 rows, bytes]
    groups = grouped // GROUP_ROWS
    rows = qweight[:grouped].reshape(groups, GROUP_ROWS, blocks, size).transpose(1, 2)
    body = rows[..., :words * 4].reshape(*rows.shape[:3], words, 4).transpose(2, 3)
    tail = rows[..., words * 4:]
    packed = torch.cat((body.reshape(groups, blocks, words * 4 * GROUP_ROWS),
                        tail.reshape(groups, blocks, (size - words * 4) * GROUP_ROWS)), dim=-1)
    out[:grouped] = packed.reshape(grouped, qweight.shape[1])
    return out


def unpack(packed: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """The GGUF rows that :func:`repack` turned into ``packed`` (a new tensor)."""
    grouped, blocks, size = _groups(packed, ggml_type)
    words = size // 4
    out = packed.clone()
    group = packed[:grouped].reshape(grouped // GROUP_ROWS, blocks, GROUP_ROWS * size)
    body = group[..., :words * 4 * GROUP_ROWS].reshape(*group.shape[:2], words, GROUP_ROWS, 4)
    tail = group[..., words * 4 * GROUP_ROWS:].reshape(*group.shape[:2], GROUP_ROWS,
                                                       size - words * 4)
    rows = torch.cat((body.transpose(2, 3).reshape(*group.shape[:2], GROUP_ROWS, words * 4), tail),
                     dim=-1)
    out[:grouped] = rows.transpose(1, 2).reshape(grouped, packed.shape[1])
    return out


def ggml_linear_repacked(x: torch.Tensor, packed: torch.Tensor, ggml_type: int,
                         bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """The ``ggml_linear_repacked`` op: :func:`unpack`, then the ``ggml_linear`` reference."""
    return ggml_linear(x, unpack(packed, ggml_type), ggml_type, bias, out)


def ggml_embedding_repacked(ids: torch.Tensor, packed: torch.Tensor, ggml_type: int
                            ) -> torch.Tensor:
    """The ``ggml_embedding_repacked`` op: rows ``ids`` of the rows :func:`unpack` gives
    back, dequantized (the ``ggml_embedding`` reference on them)."""
    return ggml_embedding(ids, unpack(packed, ggml_type), ggml_type)
