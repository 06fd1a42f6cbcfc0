"""Resident tensors: weights and KV caches an engine placed on the JAX device stay there.

The stand-in computes on JAX's second CPU device (``conftest.py``), so a placed tensor's
copy is a separate buffer from torch's memory and every assertion about which one an op
read or wrote can fail.
"""

from __future__ import annotations

import gc

import jax
import numpy as np
import torch

from hwplug.attention import PagedAttentionParams
from hwplug.kernel_registry import ops
from hwplug_tpu import bridge, variants
from hwplug_tpu.layout import RPA_INTERLEAVED


def test_the_plugin_computes_on_a_device_apart_from_the_host():
    assert bridge.device() == jax.devices("cpu")[-1] != bridge.host()


def test_a_placed_weight_is_read_from_its_device_copy_until_torch_writes_it():
    weight = torch.randn(8, 16)
    bridge.place(weight, bridge.device())
    copy = bridge.resident(weight)
    assert copy.devices() == {bridge.device()}
    assert bridge.to_jax(weight) is copy  # no transfer per op
    x = torch.randn(3, 16)
    torch.testing.assert_close(variants.linear(x, weight), x @ weight.T)
    with torch.no_grad():
        weight.mul_(2)  # the version counter moves: uploaded again, once
    again = bridge.resident(weight)
    assert again is not copy and bridge.resident(weight) is again
    torch.testing.assert_close(variants.linear(x, weight), x @ weight.T)


def test_a_placed_cache_is_written_on_the_device_only():
    """The cache write replaces the device copy (what the reference writes into a host
    cache), leaving the torch tensor as it was; attention reads the device copy."""
    generator = torch.Generator().manual_seed(0)
    cache = torch.zeros(4, 8, 2 * 2, 16)
    bridge.place(cache, bridge.device(), mutable=True)
    assert bridge.is_cache(cache)
    key, value = (torch.randn(5, 2, 16, generator=generator) for _ in range(2))
    slots = torch.tensor([9, 3, -1, 30, 17])
    params = PagedAttentionParams(0.25, layout=RPA_INTERLEAVED)
    variants.reshape_and_cache(key, value, cache, slots, params)
    want = torch.zeros_like(cache)
    ops.reshape_and_cache.reference(key, value, want, slots, params)
    assert not cache.any()
    device_copy = bridge.resident(cache)
    assert device_copy.devices() == {bridge.device()}
    np.testing.assert_array_equal(np.asarray(jax.device_get(device_copy)), want.numpy())


def test_a_placed_tensor_is_forgotten_with_it():
    weight = torch.randn(4, 4)
    bridge.place(weight, bridge.device())
    key = id(weight)
    entry = bridge._entries[key]
    del weight
    gc.collect()
    # this entry went (another thread may have placed a tensor at the freed address since)
    assert bridge._entries.get(key) is not entry
