"""Mixture of experts in JAX: routing (``moe_topk``), the experts (``moe_experts``) and both
with shared experts (``fused_moe``), as :mod:`hwplug.kernel_registry.reference.moe` computes
them, jitted with static shapes.

**Dispatch: tokens sorted by expert, then two grouped matmuls** (``jax.lax.ragged_dot``,
in :func:`ragged_dot_general` form so the stacked weights are read as stored, ``w13 [E, 2I,
H]`` and ``w2 [E, H, I]``, without a transposed copy). The ``T * k`` (token, slot) pairs
are sorted by expert id (a stable ``argsort``), their rows of ``x`` gathered, and each
expert's contiguous run of rows multiplied by that expert's weights alone; the group sizes
(a ``bincount`` of the ids) are data, the shapes are not, so a batch of any routing
compiles once per bucket and an expert no token chose costs nothing on a TPU (its group is
empty). The weighted rows are summed back per token by a scatter-add. The alternatives
were a one-hot combine (every expert over every token: ``E / k`` times the FLOPs) or a
per-expert loop (a trace per expert and data-dependent shapes). Matmuls accumulate in
fp32; the gated activation is computed in fp32 and handed to the second matmul in the
weights' dtype (as the cpu platform's variant keeps it; within the op's tolerances).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from hwplug_tpu.jax_ops import act_and_mul

_F32 = jnp.float32
#: Rows grouped along the lhs' dimension 0 against ``rhs [E, N, K]``: contract K with K.
_GROUPED = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(((1,), (2,)), ((), ())),
                                         lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
_ROUTING = ("top_k", "renormalize", "scoring", "num_expert_group", "topk_group",
            "routed_scaling_factor")


def route(router_logits: jax.Array, correction_bias: jax.Array | None, *, top_k: int,
          renormalize: bool, scoring: str, num_expert_group: int | None,
          topk_group: int | None, routed_scaling_factor: float
          ) -> tuple[jax.Array, jax.Array]:
    """``moe_topk``: ``(weights [T, top_k] fp32, ids [T, top_k] int32)``, best choice first
    (arguments as the reference's, checked by the caller)."""
    logits = router_logits.astype(_F32)
    scores = jax.nn.softmax(logits, axis=-1) if scoring == "softmax" else jax.nn.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.astype(_F32)
    if num_expert_group is not None:
        grouped = choice.reshape(choice.shape[0], num_expert_group, -1)
        group_scores = (grouped.max(-1) if correction_bias is None else
                        lax.top_k(grouped, min(2, grouped.shape[-1]))[0].sum(-1))
        best = lax.top_k(group_scores, topk_group)[1]  # [T, topk_group]
        keep = (jnp.arange(num_expert_group) == best[..., None]).any(-2)  # [T, G]
        choice = jnp.where(keep[..., None], grouped, -jnp.inf).reshape(choice.shape)
    ids = lax.top_k(choice, top_k)[1]
    weights = jnp.take_along_axis(scores, ids, axis=-1)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdims=True)
                             + (1e-20 if scoring == "sigmoid" else 0.0))
    return weights * routed_scaling_factor, ids.astype(jnp.int32)


def _grouped(rows: jax.Array, weights: jax.Array, sizes: jax.Array) -> jax.Array:
    """``rows [M, K]`` (sorted by group, ``sizes [E]`` rows each) times their group's
    ``weights [E, N, K]`` transposed: fp32 ``[M, N]``."""
    return lax.ragged_dot_general(rows, weights, sizes, _GROUPED, preferred_element_type=_F32)


def _experts(x: jax.Array, w13: jax.Array, w2: jax.Array, weights: jax.Array,
             ids: jax.Array, activation: str) -> jax.Array:
    """fp32 ``[T, H]``: each token's chosen experts' MLPs, weighted and summed."""
    num_tokens, top_k = ids.shape
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # (token, slot) pairs grouped by expert
    tokens = order // top_k
    sizes = jnp.bincount(flat, length=w13.shape[0]).astype(jnp.int32)
    hidden = act_and_mul(_grouped(x[tokens], w13, sizes), activation).astype(w2.dtype)
    rows = _grouped(hidden, w2, sizes) * weights.reshape(-1)[order, None].astype(_F32)
    return jnp.zeros((num_tokens, x.shape[1]), _F32).at[tokens].add(rows)


@functools.partial(jax.jit, static_argnames="activation")
def experts(x: jax.Array, w13: jax.Array, w2: jax.Array, weights: jax.Array, ids: jax.Array,
            *, activation: str) -> jax.Array:
    """``moe_experts``: ``[T, H]`` in ``x.dtype`` (see the module docstring)."""
    return _experts(x, w13, w2, weights, ids, activation).astype(x.dtype)


def _mlp(x: jax.Array, w13: jax.Array, w2: jax.Array, activation: str) -> jax.Array:
    """fp32 ``w2 @ act_and_mul(w13 @ x)`` of one expert (``w13 [2S, H]``, ``w2 [H, S]``)."""
    dims = (((1,), (1,)), ((), ()))
    hidden = act_and_mul(lax.dot_general(x, w13, dims, preferred_element_type=_F32), activation)
    return lax.dot_general(hidden.astype(w2.dtype), w2, dims, preferred_element_type=_F32)


@functools.partial(jax.jit, static_argnames=(*_ROUTING, "activation"))
def fused(x: jax.Array, router_logits: jax.Array, w13: jax.Array, w2: jax.Array,
          correction_bias: jax.Array | None, shared_w13: jax.Array | None,
          shared_w2: jax.Array | None, *, activation: str, **routing: object) -> jax.Array:
    """``fused_moe``: :func:`route`, the experts, plus the shared experts' MLP when given;
    ``[T, H]`` in ``x.dtype``."""
    weights, ids = route(router_logits, correction_bias, **routing)
    out = _experts(x, w13, w2, weights, ids, activation)
    if shared_w13 is not None:
        out = out + _mlp(x, shared_w13, shared_w2, activation)
    return out.astype(x.dtype)


#: :func:`route`, jitted.
route_jit = jax.jit(route, static_argnames=_ROUTING)
