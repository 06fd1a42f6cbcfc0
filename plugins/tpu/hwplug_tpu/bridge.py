"""torch tensors <-> JAX arrays through DLPack, on the JAX device the plugin computes on.

torch has no TPU device without torch_xla, so the model's tensors stay torch tensors on
the host and each op of this plugin runs a jitted JAX function on JAX arrays that share
their memory (DLPack: no copy on the host). When the JAX device is not the host (a
TPU), every input is transferred to it and every output back, weights and KV caches
included: correct, but far from what a TPU can do (see the plugin's README).

Shapes are padded to buckets (:func:`bucket`, powers of two) before a jitted function
sees them, so each function compiles once per bucket rather than once per batch shape.
"""

from __future__ import annotations

import functools

import jax
import torch


def bucket(n: int) -> int:
    """The shape bucket of size ``n``: the smallest power of two >= ``n`` (1 for 0)."""
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def host() -> jax.Device:
    """JAX's CPU device: where DLPack shares memory with torch's CPU tensors."""
    return jax.devices("cpu")[0]


@functools.cache
def device() -> jax.Device:
    """The device the ops compute on: JAX's first TPU when it has one, else the host."""
    tpus = [d for d in jax.devices() if d.platform == "tpu"]
    return tpus[0] if tpus else host()


def to_jax(tensor: torch.Tensor) -> jax.Array:
    """``tensor`` as a JAX array on :func:`device` (int64 as int32, JAX's integer width
    without x64). On the host it shares ``tensor``'s memory (a non-contiguous tensor is
    copied first); elsewhere the data is transferred."""
    shared = tensor.to(torch.int32) if tensor.dtype == torch.int64 else tensor.contiguous()
    array = jax.dlpack.from_dlpack(shared)
    target = device()
    return array if target == host() else jax.device_put(array, target)


def to_torch(array: jax.Array) -> torch.Tensor:
    """A finished JAX result as a torch CPU tensor (shares its memory on the host)."""
    if array.devices() != {host()}:
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
