"""``x @ W.T`` in fp32 with ``W`` materialised a tile of rows at a time, for weights kept
in another form (GGUF blocks, bf16): each tile is written into a per-thread buffer, then
multiplied by the platform's fp32 ``linear`` op (on AVX2 CPUs the C GEMM; elsewhere
oneDNN's, which packs each tile afresh), whose register blocking wins once enough
activation rows share each weight value.

The buffer is allocated once per thread at its largest size: a fresh multi-megabyte tensor
per call is a fresh ``mmap`` whose page faults, measured in SmolLM2 Q4_1 decode steps at 32
and 48 rows, doubled the time of the GGUF kernel's tiles.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from hwplug.kernel_registry import ops

#: Most weight values materialised at once (4 MiB of fp32).
TILE_VALUES = 1 << 20

_local = threading.local()

#: ``fill(start, stop, tile)`` writes weight rows ``start:stop`` as fp32 into ``tile``.
Fill = Callable[[int, int, torch.Tensor], None]


def tile_buffer(values: int) -> torch.Tensor:
    """``values`` fp32 of this thread's tile buffer (at least :data:`TILE_VALUES`), grown
    when a call needs more. The contents are the previous caller's: write before reading,
    and do not keep the view past the call."""
    buffer = getattr(_local, "tiles", None)
    if buffer is None or buffer.numel() < values:
        # a normal tensor even when first asked for under inference_mode: an inference
        # tensor could not be written by a later call outside it
        with torch.inference_mode(False):
            buffer = _local.tiles = torch.empty(max(values, TILE_VALUES), dtype=torch.float32)
    return buffer[:values]


def linear_by_tiles(x: torch.Tensor, n: int, fill: Fill, bias: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """fp32 ``x [M, K] @ W.T + bias`` for the ``[n, K]`` weight that ``fill`` writes a tile
    at a time (``x`` and ``bias`` fp32)."""
    k = x.shape[1]
    step = max(1, TILE_VALUES // k)
    if step >= n:  # one tile: no copy of the product
        tile = tile_buffer(n * k).view(n, k)
        fill(0, n, tile)
        return ops.linear(x, tile, bias)
    out = torch.empty((x.shape[0], n), dtype=torch.float32)
    tile = tile_buffer(step * k).view(step, k)
    for start in range(0, n, step):
        stop = min(start + step, n)
        fill(start, stop, tile[:stop - start])
        out[:, start:stop] = ops.linear(x, tile[:stop - start],
                                        None if bias is None else bias[start:stop])
    return out
