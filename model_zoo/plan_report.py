"""The kernels a built model's layers bound, layer by layer (``hwplug generate --verbose``).

A layer holds each op it calls as a :class:`~hwplug.kernel_registry.BoundOp` attribute
(its attention backend holds its two cache ops the same way). :func:`layer_kernels`
walks the model and lists them, layers that bound the same thing collapsed into one row
(``model.layers.*.mlp.act``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torch import nn

from hwplug.kernel_registry import BoundOp

_INDEX = re.compile(r"\.\d+(?=\.|$)")


def _bound_ops(owner: object, path: str) -> Iterator[tuple[str, BoundOp]]:
    for name, value in vars(owner).items():
        if isinstance(value, BoundOp):
            yield f"{path}.{name}" if path else name, value
        elif name == "backend":  # an attention backend binds its cache ops
            yield from _bound_ops(value, f"{path}.{name}")


def layer_kernels(model: nn.Module) -> list[tuple[str, str, str]]:
    """``(layers, op and its key, variant per token bucket)`` rows, in model order: the
    layers (attribute paths, layer indices as ``*``) that bound the same op for the same
    dtype and layout with the same choice share a row."""
    rows: dict[tuple[str, str, str], None] = {}
    for path, module in model.named_modules():
        for where, bound in _bound_ops(module, path):
            key = ", ".join(filter(None, (bound.dtype, bound.layout)))
            rows.setdefault((_INDEX.sub(".*", where), f"{bound.op} ({key})",
                             bound.describe()), None)
    return list(rows)
