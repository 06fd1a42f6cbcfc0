"""torch tensors <-> JAX arrays through DLPack, on the JAX device the plugin computes on.

torch has no TPU device without torch_xla, so the model's tensors are torch tensors on
the host; the ops of this plugin run jitted JAX functions on :func:`device`. A tensor the
engine placed there (its weights and KV caches, see below) is read from its device copy;
any other is shared with JAX on the host (DLPack: no copy) and, when the device is not
the host, transferred. Results come back the same way.

Shapes are padded to buckets (:func:`bucket`, powers of two) before a jitted function
sees them, so each function compiles once per bucket rather than once per batch shape.

**Resident tensors.** The engine's model runner hands the tpu platform its model's
parameters and buffers and its KV caches once
(:meth:`hwplug_tpu.platform.TpuPlatform.place_state`); each is copied to :func:`device`
(:func:`place`) and from then on the ops read that copy (:func:`to_jax` looks there
first), so no weight or cache crosses per op or per step.

- A weight is uploaded once and again only when its torch tensor was written since
  (its version counter moved): weights are read-only between calls (the ``linear``
  contract), so in practice once.
- A KV cache's device copy is the cache: the cache ops replace it with the array they
  computed (:func:`replace_cache`), and the torch tensor is not written any more.

Entries are keyed by the torch tensor object and dropped when it is garbage collected,
so engines created one after another in a process do not see each other's arrays.

**What crosses.** Every transfer between the host and a device that is not the host
goes through :func:`send` or :func:`to_torch`, which count it in :data:`TRANSFERS`
(arrays and bytes each way): what a step moves can be read there.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import weakref
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import torch

logger = logging.getLogger(__name__)


def bucket(n: int) -> int:
    """The shape bucket of size ``n``: the smallest power of two >= ``n`` (1 for 0)."""
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def host() -> jax.Device:
    """JAX's CPU device: where DLPack shares memory with torch's CPU tensors."""
    return jax.devices("cpu")[0]


@functools.cache
def device() -> jax.Device:
    """The device the ops compute on: JAX's first TPU when it has one; else (JAX's CPU
    standing in) JAX's last CPU device, which is not the host's when JAX has several
    (``XLA_FLAGS=--xla_force_host_platform_device_count=2``): then every crossing between
    torch's memory and the device is a real transfer, as on a TPU."""
    tpus = [d for d in jax.devices() if d.platform == "tpu"]
    return tpus[0] if tpus else jax.devices("cpu")[-1]


def host_array(tensor: torch.Tensor) -> jax.Array:
    """``tensor`` as a JAX array on :func:`host` sharing its memory (int64 as int32, JAX's
    integer width without x64; a non-contiguous tensor is copied first)."""
    shared = tensor.to(torch.int32) if tensor.dtype == torch.int64 else tensor.contiguous()
    return jax.dlpack.from_dlpack(shared)


@dataclass
class Transfers:
    """Arrays and bytes moved between the host and a device that is not the host, each
    way, since the last :meth:`reset`."""

    to_device: int = 0
    to_device_bytes: int = 0
    to_host: int = 0
    to_host_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, array: jax.Array, *, to_host: bool) -> None:
        """Count one transfer of ``array``."""
        with self._lock:
            if to_host:
                self.to_host += 1
                self.to_host_bytes += array.nbytes
            else:
                self.to_device += 1
                self.to_device_bytes += array.nbytes

    def reset(self) -> None:
        with self._lock:
            self.to_device = self.to_device_bytes = self.to_host = self.to_host_bytes = 0


#: This process's transfers (see the module docstring).
TRANSFERS = Transfers()


def send(value: torch.Tensor | np.ndarray, target: jax.Device) -> jax.Array:
    """A host tensor or array on ``target`` (shared, not copied, when that is the host;
    else transferred and counted in :data:`TRANSFERS`)."""
    array = host_array(value) if isinstance(value, torch.Tensor) else jax.device_put(
        value, host())
    if target == host():
        return array
    TRANSFERS.count(array, to_host=False)
    return jax.device_put(array, target)


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """``tensor`` as a JAX array on :func:`device`: its resident copy when the engine
    placed it there (a view of a placed weight: that view of its copy, see
    :func:`placed_base`), else shared on the host (:func:`host_array`) and transferred
    when the device is not the host."""
    placed = resident(tensor)
    if placed is not None:
        return placed
    base = placed_base(tensor)
    if base is not None:
        return strided_view(resident(base), *view_of(tensor, base))
    return send(tensor, device())


def placed_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The placed, contiguous weight ``tensor`` is a view of (DeepSeek's ``W_UK`` and
    ``W_UV``, views of ``kv_b_proj``'s weight), or None."""
    base = tensor._base
    if base is None or not base.is_contiguous() or base.storage_offset():
        return None
    entry = _entries.get(id(base))
    return base if entry is not None and not entry.mutable else None


def view_of(tensor: torch.Tensor, base: torch.Tensor
            ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """``tensor``'s offset, shape and strides in ``base``'s elements (for
    :func:`strided_view`)."""
    return tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride())


def to_torch(array: jax.Array) -> torch.Tensor:
    """A finished JAX result as a torch CPU tensor (shares its memory on the host; from a
    device that is not the host, transferred and counted in :data:`TRANSFERS`)."""
    if array.devices() != {host()}:
        TRANSFERS.count(array, to_host=True)
        array = jax.device_put(array, host())
    return torch.from_dlpack(array.block_until_ready())


def padded(tensor: torch.Tensor, rows: int, value: float = 0) -> torch.Tensor:
    """``tensor`` with its leading dimension padded to ``rows`` by ``value`` (no copy when
    it already has that many)."""
    extra = rows - tensor.shape[0]
    if extra == 0:
        return tensor
    fill = tensor.new_full((extra, *tensor.shape[1:]), value)
    return torch.cat((tensor, fill))


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expected = 1
    for size, step in reversed(list(zip(shape, stride, strict=True))):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def strided_view(base: jax.Array, offset: int, shape: tuple[int, ...],
                 stride: tuple[int, ...]) -> jax.Array:
    """The torch view ``(offset, shape, stride)`` (in elements) of the contiguous ``base``:
    a slice when it is contiguous or rows of contiguous blocks (a ``split`` along the last
    dimension), else a gather."""
    flat = base.reshape(-1)
    count = math.prod(shape)
    if _contiguous(shape, stride):
        return flat[offset:offset + count].reshape(shape)
    row, inner = stride[0], math.prod(shape[1:])
    first, column = divmod(offset, row) if row else (0, offset)
    if (row and flat.shape[0] % row == 0 and _contiguous(shape[1:], stride[1:])
            and column + inner <= row):
        rows = flat.reshape(-1, row)[first:first + shape[0], column:column + inner]
        return rows.reshape(shape)
    index = offset + sum(np.arange(size).reshape([-1 if d == i else 1 for d in
                                                  range(len(shape))]) * step
                         for i, (size, step) in enumerate(zip(shape, stride, strict=True)))
    return flat[jnp.asarray(index, dtype=jnp.int32)]


@dataclass
class _Entry:
    array: jax.Array
    version: int
    mutable: bool


_entries: dict[int, _Entry] = {}
_lock = threading.Lock()


def _upload(tensor: torch.Tensor, target: jax.Device, copy: bool) -> jax.Array:
    """``tensor`` on ``target``: its memory shared through DLPack when ``target`` is the host
    and no ``copy`` is asked for, else copied."""
    array = jax.device_put(host_array(tensor), target, may_alias=False if copy else None)
    return array.block_until_ready()


def place(tensor: torch.Tensor, target: jax.Device, *, mutable: bool = False) -> None:
    """Keep ``tensor`` on ``target`` from now on; ``mutable``: a KV cache (its device copy is
    the cache, see the module docstring), else a weight."""
    key = id(tensor)
    with _lock:
        if key in _entries:
            return
        _entries[key] = _Entry(_upload(tensor, target, copy=mutable), tensor._version, mutable)
    weakref.finalize(tensor, _entries.pop, key, None)


def resident(tensor: torch.Tensor) -> jax.Array | None:
    """The device array of a placed ``tensor`` (a weight written since it was placed is
    uploaded again), or None when ``tensor`` was not placed."""
    entry = _entries.get(id(tensor))
    if entry is None:
        return None
    if not entry.mutable and entry.version != tensor._version:
        logger.info("a resident weight %s was written: uploading it again",
                    tuple(tensor.shape))
        entry.array = _upload(tensor, next(iter(entry.array.devices())), copy=False)
        entry.version = tensor._version
    return entry.array


def is_cache(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a placed KV cache (whose device copy is the cache)."""
    entry = _entries.get(id(tensor))
    return entry is not None and entry.mutable


def replace_cache(cache: torch.Tensor, new: jax.Array) -> None:
    """Make ``new`` the device copy of the placed KV cache ``cache``."""
    entry = _entries[id(cache)]
    if not entry.mutable:
        raise TypeError("only a placed KV cache is replaced, not a weight")
    entry.array = new
