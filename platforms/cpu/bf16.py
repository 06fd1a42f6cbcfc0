"""``linear`` on bfloat16 weights for CPUs without bf16 arithmetic: bf16 is the storage
format (half the bytes of fp32 to read), the arithmetic is fp32.

Below :data:`UPCAST_FROM_ROWS` activation rows, torch's bf16 GEMM: a matrix-vector product
bound by reading the weight, which widens each value to fp32 and accumulates in fp32, so
the half-size weight makes it faster than fp32 weights. From there on that GEMM (no
hardware bf16, no register blocking) grows linearly with the rows, so the weight is
widened a tile at a time into fp32 and multiplied by the fp32 ``linear`` op
(:func:`~hwplug.platforms.cpu.tiles.linear_by_tiles`). Measured on a 2-core AVX2 EPYC in
SmolLM2 bf16 decode steps, the tiles then through torch's fp32 GEMM (against
``HWPLUG_DISABLED_KERNELS=bf16_storage``, torch's bf16 GEMM throughout): 100 vs 105 ms per step at batch 8, 120 vs 185 at 16, 169 vs 356 at 32;
switching at 64 rows instead kept 105 and 185. benchmarks/bf16_linear.py times the
GEMMs alone. Where the CPU has bf16 arithmetic, oneDNN's bf16 path
(``onednn_packed_bf16``) ranks first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hwplug.platforms.cpu.tiles import linear_by_tiles

#: Activation rows from which the weight is widened to fp32 tiles.
UPCAST_FROM_ROWS = 8


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """The ``linear`` op for bf16 ``x`` and ``weight``: bf16 out, fp32 arithmetic."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] < UPCAST_FROM_ROWS:
        return F.linear(x, weight, bias)

    def fill(start: int, stop: int, tile: torch.Tensor) -> None:
        tile.copy_(weight[start:stop])

    out = linear_by_tiles(rows.float(), weight.shape[0], fill,
                          None if bias is None else bias.float())
    return out.to(x.dtype).view(*x.shape[:-1], weight.shape[0])
