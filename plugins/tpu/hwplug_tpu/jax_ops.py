"""The ops of hwplug's kernel registry as jitted JAX functions on JAX arrays.

Each computes as the op's pure-torch reference says (fp32 inside, outputs in the input
dtype; see :mod:`hwplug.kernel_registry.ops`) and is compiled once per input shape,
dtype and static option: :mod:`hwplug_tpu.variants` pads the token dimension to buckets
before calling them. Attention is in :mod:`hwplug_tpu.rpa`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32


def _normalize(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(_F32)
    inv_rms = lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (x32 * inv_rms * weight.astype(_F32)).astype(x.dtype)


@functools.partial(jax.jit, static_argnames="eps")
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``x [N, H] * rsqrt(mean(x**2) + eps) * weight [H]``."""
    return _normalize(x, weight, eps)


@functools.partial(jax.jit, static_argnames="eps")
def add_rms_norm(x: jax.Array, residual: jax.Array, weight: jax.Array, eps: float
                 ) -> tuple[jax.Array, jax.Array]:
    """``s = x + residual`` in ``x.dtype``; returns ``(rms_norm(s), s)``."""
    summed = (x.astype(_F32) + residual.astype(_F32)).astype(x.dtype)
    return _normalize(summed, weight, eps), summed


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, is_neox: bool) -> jax.Array:
    rot_dim = 2 * cos.shape[-1]
    rotated = x[..., :rot_dim].astype(_F32)
    if is_neox:
        x1, x2 = jnp.split(rotated, 2, axis=-1)
    else:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    out1, out2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if is_neox:
        rotated = jnp.concatenate((out1, out2), axis=-1)
    else:
        rotated = jnp.stack((out1, out2), axis=-1).reshape(rotated.shape)
    return jnp.concatenate((rotated.astype(x.dtype), x[..., rot_dim:]), axis=-1)


@functools.partial(jax.jit, static_argnames="is_neox")
def rotary_embedding(positions: jax.Array, query: jax.Array, key: jax.Array,
                     cos_sin_cache: jax.Array, is_neox: bool) -> tuple[jax.Array, jax.Array]:
    """Rotate ``query [T, Hq, D]`` and ``key [T, Hkv, D]`` by the angles of ``positions``
    (cos in the first half of ``cos_sin_cache``'s columns, sin in the second)."""
    cos, sin = jnp.split(cos_sin_cache[positions].astype(_F32), 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return _rotate(query, cos, sin, is_neox), _rotate(key, cos, sin, is_neox)


#: Gated activations by name: ``act(gate)`` of ``act(gate) * up`` (``gelu``: erf form).
ACTIVATIONS = {"silu": jax.nn.silu,
               "gelu": functools.partial(jax.nn.gelu, approximate=False),
               "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}


def act_and_mul(x: jax.Array, activation: str) -> jax.Array:
    """``act(x[..., :d]) * x[..., d:]`` in fp32 (``activation``: a key of
    :data:`ACTIVATIONS`)."""
    gate, up = jnp.split(x.astype(_F32), 2, axis=-1)
    return ACTIVATIONS[activation](gate) * up


@jax.jit
def silu_and_mul(x: jax.Array) -> jax.Array:
    """``silu(x[..., :d]) * x[..., d:]``."""
    return act_and_mul(x, "silu").astype(x.dtype)


@functools.partial(jax.jit, static_argnames="approximate")
def gelu_and_mul(x: jax.Array, approximate: str) -> jax.Array:
    """``gelu(x[..., :d]) * x[..., d:]``, erf form (``"none"``) or tanh form."""
    return act_and_mul(x, "gelu_tanh" if approximate == "tanh" else "gelu").astype(x.dtype)


@jax.jit
def linear(x: jax.Array, weight: jax.Array, bias: jax.Array | None) -> jax.Array:
    """``x [..., K] @ weight [N, K].T + bias``, accumulated in fp32."""
    out = lax.dot_general(x, weight, (((x.ndim - 1,), (1,)), ((), ())),
                          preferred_element_type=_F32)
    if bias is not None:
        out = out + bias.astype(_F32)
    return out.astype(x.dtype)


@jax.jit
def embedding(ids: jax.Array, weight: jax.Array) -> jax.Array:
    """Rows ``ids [T]`` of ``weight [V, H]``."""
    return weight[ids]


def _store_kv(kv_pages: jax.Array, key: jax.Array, value: jax.Array, slots: jax.Array
              ) -> jax.Array:
    """``kv_pages [num_blocks, block_size, 2 * Hkv, D]`` with ``key``/``value [T, Hkv, D]``
    stored at ``slots [T]`` (interleaved: KV head ``h``'s key at head index ``2h``, its value
    at ``2h + 1``; cast to the cache dtype); a negative slot is skipped."""
    rows = jnp.stack((key, value), axis=2).reshape(key.shape[0], 2 * key.shape[1],
                                                  key.shape[2])
    return store_rows(kv_pages, rows, slots)


def store_rows(pages: jax.Array, rows: jax.Array, slots: jax.Array) -> jax.Array:
    """``pages [num_blocks, block_size, ...]`` with token ``t``'s ``rows[t]`` (cast to the
    cache dtype) at slot ``slots[t]`` (block ``slot // block_size``, offset ``slot %
    block_size``); a negative slot is skipped."""
    flat = pages.reshape(-1, *pages.shape[2:])
    slots = jnp.where(slots < 0, flat.shape[0], slots)  # out of range: dropped
    return flat.at[slots].set(rows.astype(pages.dtype), mode="drop").reshape(pages.shape)


#: :func:`_store_kv` returning a new cache.
store_kv = jax.jit(_store_kv)
#: :func:`_store_kv` reusing the cache's buffer (the array passed in is consumed).
store_kv_in_place = jax.jit(_store_kv, donate_argnums=0)
