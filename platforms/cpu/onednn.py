"""``linear`` on CPUs through oneDNN, with each weight reordered once into its blocked layout.

A plain ``F.linear`` hands oneDNN the row-major weight on every call; the packed copy is
already in the order the CPU's matmul micro-kernel consumes. The copy is cached per
weight tensor (weakly: it goes when the weight goes) and rebuilt if the weight is
written in place, which its version counter shows. It costs a second copy of each weight;
where memory is tight, ``HWPLUG_DISABLED_KERNELS=onednn_packed,onednn_packed_bf16`` falls
back to ``F.linear``. The bf16 path needs bf16 arithmetic in hardware (AVX512-BF16 or AMX),
which the registration states as the ``bf16`` device feature.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakTensorKeyDictionary

if not torch.backends.mkldnn.is_available():
    raise ImportError("this torch build has no oneDNN (torch.backends.mkldnn unavailable)")

#: weight -> (its ``_version`` when packed, the packed copy).
_packed: WeakTensorKeyDictionary = WeakTensorKeyDictionary()


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [N, K]`` reordered for oneDNN, packed on first use and after each write."""
    entry = _packed.get(weight)
    if entry is None or entry[0] != weight._version:
        entry = (weight._version, torch.ops.mkldnn._reorder_linear_weight(weight.detach()))
        _packed[weight] = entry
    return entry[1]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """The ``linear`` op on a packed copy of ``weight``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight(weight), bias, "none", [], "")
