"""Sampling on the JAX device: the tpu platform's :class:`~hwplug.step_replay.DeviceSampler`.

:func:`sample` is a pure JAX function over a step's logits ``[N, V]`` and per-row
arrays (:func:`request_arrays`). It does what the host's sampler
(:func:`hwplug.model_zoo.sampling.sample`) does for the common cases: greedy rows take the
argmax of the raw logits; sampled rows draw from ``softmax(logits / temperature)``
restricted to their top-k and top-p set (the same truncation as the reference's
``truncate``), by the Gumbel-max trick. A row's noise comes from the JAX PRNG key
``fold_in(key(seed), position)``: a function of its seed and the position of the token it
samples only, so a seeded request is reproducible whatever else its steps hold. The
draws are not the host's (torch's generators), but the distribution is.

A compiled decode step ends in :func:`sample` (:meth:`hwplug_tpu.step.CompiledStep.replay_sampled`),
so only the step's token ids come back, plus, when a request asks for log-probabilities,
each row's sampled-token log-probability and rank and the top ``k`` (``k`` padded to a
power of two: one compilation per bucket met). :class:`JaxSampler` samples an eager step's
logits the same way.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import torch

from hwplug.step_replay import SampledTokens, SampleRequest
from hwplug_tpu.bridge import bucket, device, send, to_torch

logger = logging.getLogger(__name__)

_F32 = jnp.float32


def request_arrays(request: SampleRequest, rows: int) -> list[np.ndarray]:
    """``request`` as the host arrays :func:`sample` takes after the logits, padded to
    ``rows`` with greedy rows: temperature, top_k, top_p (float32/int32/float32 ``[rows]``),
    the seeds as two uint32 words ``[rows, 2]`` (a JAX threefry key's data) and the
    positions (int32 ``[rows]``)."""
    n = len(request.seeds)
    extra = rows - n

    def column(values: object, dtype: type) -> np.ndarray:
        return np.concatenate((np.asarray(values, dtype=dtype), np.zeros(extra, dtype=dtype)))

    seeds = np.asarray([[s >> 32, s & 0xFFFFFFFF] for s in request.seeds], dtype=np.uint32)
    return [column(request.temperature, np.float32), column(request.top_k, np.int32),
            np.concatenate((np.asarray(request.top_p, dtype=np.float32),
                            np.ones(extra, dtype=np.float32))),
            np.concatenate((seeds.reshape(n, 2), np.zeros((extra, 2), dtype=np.uint32))),
            column(request.positions, np.int32)]


def logprobs_width(request: SampleRequest) -> int | None:
    """The number of top log-probabilities :func:`sample` computes for ``request``: the
    most asked for, padded to a power of two (None when no row asks)."""
    return None if request.logprobs is None else bucket(request.logprobs)


def _truncate(logits: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """``logits [N, V]`` with the tokens outside each row's top-k (0 = all) and top-p set at
    ``-inf`` (the reference's ``truncate``)."""
    vocab = logits.shape[-1]
    top_k = jnp.where(top_k > 0, top_k, vocab)
    order = jnp.argsort(-logits, axis=-1, stable=True)
    ordered = jnp.take_along_axis(logits, order, axis=-1)
    removed = jnp.arange(vocab)[None, :] >= top_k[:, None]
    ordered = jnp.where(removed, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    removed |= (jnp.cumsum(probs, axis=-1) - probs) >= top_p[:, None]
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.empty_like(logits).at[rows, order].set(jnp.where(removed, -jnp.inf, ordered))


def _draw(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
          seeds: jax.Array, positions: jax.Array) -> jax.Array:
    """One token per row of ``logits`` by the Gumbel-max trick over the row's tempered,
    truncated logits, its noise keyed by ``(seed, position)``."""
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    scaled = jax.lax.cond(jnp.any((top_k > 0) | (top_p < 1)), _truncate,
                          lambda x, *_: x, scaled, top_k, top_p)

    def noise(seed: jax.Array, position: jax.Array) -> jax.Array:
        key = jax.random.fold_in(jax.random.wrap_key_data(seed), position)
        return jax.random.gumbel(key, (logits.shape[-1],), _F32)

    return jnp.argmax(scaled + jax.vmap(noise)(seeds, positions), axis=-1)


def sample(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
           seeds: jax.Array, positions: jax.Array, *, logprobs: int | None = None
           ) -> tuple[jax.Array, ...]:
    """The next token (int32 ``[N]``) of each row of ``logits [N, V]`` (see the module
    docstring); with ``logprobs`` also the sampled token's log-probability and rank and
    the ``logprobs`` most likely tokens' log-probabilities and ids, of the raw logits."""
    logits = logits.astype(_F32)
    best = jnp.argmax(logits, axis=-1)
    greedy = temperature == 0
    tokens = jax.lax.cond(
        jnp.all(greedy), lambda: best,
        lambda: jnp.where(greedy, best, _draw(logits, temperature, top_k, top_p, seeds,
                                              positions))).astype(jnp.int32)
    if logprobs is None:
        return (tokens,)
    logp = jax.nn.log_softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(logp, tokens[:, None], axis=-1)
    ranks = jnp.sum(logp > chosen, axis=-1).astype(jnp.int32) + 1
    top_values, top_ids = jax.lax.top_k(logp, min(logprobs, logits.shape[-1]))
    return tokens, chosen[:, 0], ranks, top_values, top_ids.astype(jnp.int32)


def sampled_tokens(outputs: list[torch.Tensor], request: SampleRequest) -> SampledTokens:
    """:func:`sample`'s outputs (in torch, padded rows included) as the request's rows."""
    n = len(request.seeds)
    tokens = outputs[0][:n].tolist()
    if request.logprobs is None:
        return SampledTokens(tokens)
    chosen, ranks, top_values, top_ids = (t[:n].tolist() for t in outputs[1:])
    k = request.logprobs
    return SampledTokens(tokens, (chosen, ranks, [row[:k] for row in top_values],
                                  [row[:k] for row in top_ids]))


@functools.cache
def _jitted(logprobs: int | None) -> jax.stages.Wrapped:
    return jax.jit(functools.partial(sample, logprobs=logprobs))


class JaxSampler:
    """The tpu platform's :class:`~hwplug.step_replay.DeviceSampler` for an eager step's
    logits (rows padded to a power of two, so it compiles once per bucket)."""

    def sample(self, logits: torch.Tensor, request: SampleRequest) -> SampledTokens:
        rows = bucket(logits.shape[0])
        padded = torch.cat((logits.float(), logits.new_zeros(rows - logits.shape[0],
                                                              logits.shape[1]).float()))
        target = device()
        arrays = [send(padded, target), *(send(a, target) for a in request_arrays(request,
                                                                                    rows))]
        outputs = _jitted(logprobs_width(request))(*arrays)
        return sampled_tokens([to_torch(out) for out in outputs], request)


#: The tpu platform's sampler.
SAMPLER = JaxSampler()
