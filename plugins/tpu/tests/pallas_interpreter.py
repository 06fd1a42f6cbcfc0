"""Pallas' TPU interpret mode of jax 0.10, with two fixes that JAX's ragged paged attention
kernel needs to run in it on CPU (a test helper; the kernel itself runs unchanged).

jax 0.10.2's interpreter (``jax._src.pallas.mosaic.interpret.interpret_pallas_call``):

1. reads a ref only through indexers: ``interpret_utils.to_range`` assumes every transform
   is an ``NDIndexer`` ("For now, assume only NDIndexer transforms"), so the kernel's
   ``kv_ref = async_copy.wait().reshape(...)`` followed by strided loads stops at
   ``AttributeError: 'ReshapeTransform' object has no attribute 'indices'`` (and, for a
   bfloat16 cache, its ``ref.bitcast(jnp.uint32)`` at ``'BitcastTransform' ...``). Fixed
   here: a read through a reshape or bitcast reads the ref up to that transform, then
   applies the rest to the value (a bitcast as on TPU: the second-minor dimension packs or
   unpacks, see ``jax._src.state.utils.bitcast``).
2. checks a masked store's bounds on the wrong axis: ``SharedMemory.swap_buffer_content``
   marks ``in_bounds_mask[in_bounds_shape[i]:]`` (always axis 0) for every axis ``i``, so
   an in-bounds masked store of a block narrower than its buffer is rejected as
   "Out-of-bounds masked swap". Fixed here: a masked store is done as an unmasked store of
   ``where(mask, value, current)``, returning what the masked one returns.

The helper follows jax 0.10's interpreter (its callbacks' signatures and results), hence
hwplug-tpu's ``jax>=0.10.2,<0.11``. Older releases on the index stop at the same first
limit without it (0.9.2: ``'ReshapeTransform' object has no attribute 'indices'``; 0.7.2
and 0.8.3: ``'RefReshaper' ...``), and 0.6.2 has no ``force_tpu_interpret_mode``; 0.10.2
is the newest there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jax
import numpy as np
from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
from jax._src.pallas.mosaic.interpret import utils as interpreter_utils
from jax._src.state.types import BitcastTransform, ReshapeTransform


def _bitcast(value: np.ndarray, dtype: Any) -> np.ndarray:
    """``value [..., R, C]`` bitcast to ``dtype`` as on TPU: ``jax._src.state.utils.bitcast``
    in numpy (a wider dtype packs ``ratio`` consecutive rows, the first in the low bits)."""
    dtype = np.dtype(dtype)
    old, new = value.dtype.itemsize, dtype.itemsize
    if old == new:
        return value.view(dtype)
    if old < new:
        ratio = new // old
        packed = value.reshape(*value.shape[:-2], value.shape[-2] // ratio, ratio, -1)
        return np.ascontiguousarray(packed.swapaxes(-1, -2)).view(dtype)[..., 0]
    ratio = old // new
    unpacked = np.ascontiguousarray(value[..., None]).view(dtype).swapaxes(-1, -2)
    return unpacked.reshape(*value.shape[:-2], value.shape[-2] * ratio, -1)


def _apply(value: np.ndarray, transform: Any) -> np.ndarray:
    """``transform`` (an indexer, reshape or bitcast of a ref) applied to a value read."""
    if isinstance(transform, ReshapeTransform):
        return value.reshape(transform.shape)
    if isinstance(transform, BitcastTransform):
        return _bitcast(value, transform.dtype)
    return value[interpreter_utils.to_range((jax.tree.map(int, transform),))]


def _fixed(get: Any, swap: Any) -> tuple[Any, Any]:
    """The interpreter's ``get`` and ``swap`` callbacks with the module docstring's fixes."""
    read = get.__wrapped__  # without the failure bookkeeping, as the interpreter's DMAs call it

    def get_through_reshapes(token, device_id, local_core_id, memory_space, buffer_id,
                             transforms, *args, **kwargs):
        at = next((i for i, t in enumerate(transforms)
                   if isinstance(t, ReshapeTransform | BitcastTransform)), len(transforms))
        token, value, *rest = get(token, device_id, local_core_id, memory_space, buffer_id,
                                  tuple(transforms[:at]), *args, **kwargs)
        for transform in transforms[at:]:
            value = _apply(value, transform)
        return (token, value, *rest)

    def masked_swap_in_bounds(token, device_id, local_core_id, memory_space, buffer_id,
                              transforms, val, mask, **kwargs):
        if mask is None:
            return swap(token, device_id, local_core_id, memory_space, buffer_id, transforms,
                        val, mask, **kwargs)
        val, mask = np.asarray(val), np.asarray(mask)
        _, current = read(None, device_id, local_core_id, memory_space, buffer_id, transforms)
        merged = np.where(mask, val, np.asarray(current)).astype(val.dtype)
        token, old = swap(token, device_id, local_core_id, memory_space, buffer_id, transforms,
                          merged, None, **kwargs)
        return token, np.where(mask, old, val).astype(val.dtype)

    get_through_reshapes.__wrapped__ = read
    masked_swap_in_bounds.__wrapped__ = swap.__wrapped__
    return get_through_reshapes, masked_swap_in_bounds


@contextmanager
def tpu_interpret_mode() -> Iterator[None]:
    """Pallas calls traced inside run in TPU interpret mode, with the fixes above."""
    from jax.experimental.pallas import tpu as pltpu

    get, swap = interpreter.get, interpreter.swap
    interpreter.get, interpreter.swap = _fixed(get, swap)
    try:
        with pltpu.force_tpu_interpret_mode():
            yield
    finally:
        interpreter.get, interpreter.swap = get, swap
