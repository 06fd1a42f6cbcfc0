"""Mixture-of-experts references: routing (``moe_topk``), the experts (``moe_experts``) and
both with optional shared experts (``fused_moe``).

Expert weights are stacked as transformers (5.x) and vLLM hold them: ``w13 [E, 2I, H]``,
each expert's gate projection in rows ``[:I]`` and its up projection in ``[I:]``, and
``w2 [E, H, I]``, its down projection. Everything is computed in fp32; outputs take
``x``'s dtype, routing weights are fp32 and expert ids int64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.activation import gelu_and_mul, silu_and_mul
from hwplug.kernel_registry.reference.ggml import dequantize

#: Router scoring functions: ``softmax`` over all experts (Mixtral, Qwen-MoE) or an
#: independent ``sigmoid`` per expert (DeepSeek-V3).
SCORING = ("softmax", "sigmoid")
#: Expert activations (gated: ``act(gate) * up``).
ACTIVATIONS = {"silu": silu_and_mul, "gelu": gelu_and_mul}


def check_routing(router_logits: torch.Tensor, top_k: int, scoring: str,
                  correction_bias: torch.Tensor | None, num_expert_group: int | None,
                  topk_group: int | None) -> None:
    """Raise :class:`UnsupportedError` naming what is wrong with a routing call."""
    if router_logits.dim() != 2:
        raise UnsupportedError(f"router_logits must be [T, E], got {tuple(router_logits.shape)}")
    num_experts = router_logits.shape[1]
    if scoring not in SCORING:
        raise UnsupportedError(f"scoring {scoring!r} is not one of {', '.join(SCORING)}")
    if not 0 < top_k <= num_experts:
        raise UnsupportedError(f"top_k {top_k} must lie in [1, {num_experts}] (the experts)")
    if correction_bias is not None and tuple(correction_bias.shape) != (num_experts,):
        raise UnsupportedError(f"correction_bias must be [{num_experts}], got "
                               f"{tuple(correction_bias.shape)}")
    if (num_expert_group is None) != (topk_group is None):
        raise UnsupportedError("grouped top-k needs both num_expert_group and topk_group")
    if num_expert_group is not None:
        if num_experts % num_expert_group:
            raise UnsupportedError(f"{num_experts} experts do not split into "
                                   f"{num_expert_group} groups")
        per_group = num_experts // num_expert_group
        if not 0 < topk_group <= num_expert_group or top_k > topk_group * per_group:
            raise UnsupportedError(f"topk_group {topk_group} of {num_expert_group} groups of "
                                   f"{per_group} cannot hold top_k {top_k} experts")


def moe_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool = True, *,
             scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
             num_expert_group: int | None = None, topk_group: int | None = None,
             routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits [T, E]`` -> ``(topk_weights [T, top_k] fp32, topk_ids [T, top_k]
    int64)``, in descending order of the choice score.

    Scores are ``softmax`` over the experts or ``sigmoid`` per expert. The experts are
    chosen by ``score + correction_bias`` (DeepSeek-V3's load-balancing bias; it does not
    enter the weights). With grouped top-k the experts split into ``num_expert_group``
    equal groups, each scored by its best choice score (with a ``correction_bias``, by
    the sum of its best two, as DeepSeek-V3 does), and only the ``topk_group`` best groups
    are eligible. The weights are the chosen experts' scores, divided by their sum when
    ``renormalize`` (plus 1e-20 for sigmoid scores), times ``routed_scaling_factor``.
    """
    check_routing(router_logits, top_k, scoring, correction_bias, num_expert_group, topk_group)
    logits = router_logits.float()
    scores = logits.softmax(-1) if scoring == "softmax" else logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_expert_group is not None:
        grouped = choice.view(choice.shape[0], num_expert_group, -1)
        group_scores = (grouped.max(-1).values if correction_bias is None
                        else grouped.topk(min(2, grouped.shape[-1]), -1).values.sum(-1))
        best_groups = group_scores.topk(topk_group, -1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(1)
    topk_ids = choice.topk(top_k, -1).indices
    weights = scores.gather(1, topk_ids)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + (1e-20 if scoring == "sigmoid"
                                                              else 0.0))
    return weights * routed_scaling_factor, topk_ids


def check_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str) -> None:
    """Raise :class:`UnsupportedError` naming what is wrong with an experts call."""
    if activation not in ACTIVATIONS:
        raise UnsupportedError(f"activation {activation!r} is not one of "
                               f"{', '.join(ACTIVATIONS)}")
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise UnsupportedError(f"need x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got "
                               f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}")
    experts, rows, hidden = w13.shape
    if hidden != x.shape[1] or tuple(w2.shape) != (experts, hidden, rows // 2) or rows % 2:
        raise UnsupportedError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit "
                               f"x {tuple(x.shape)} as [E, 2I, H] and [E, H, I]")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[:1] != x.shape[:1]:
        raise UnsupportedError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights "
                               f"{tuple(topk_weights.shape)} must both be [T={x.shape[0]}, k]")


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                activation: str = "silu") -> torch.Tensor:
    """``x [T, H]`` -> ``[T, H]`` = for each token t, the sum over its slots j of
    ``topk_weights[t, j] * w2[e] @ act_and_mul(w13[e] @ x[t])`` with ``e = topk_ids[t, j]``
    (``activation``: ``silu`` or ``gelu``, erf form). Ids lie in ``[0, E)``."""
    return _experts(x, w13, w2, topk_weights, topk_ids, activation).to(x.dtype)


def _experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, activation: str) -> torch.Tensor:
    """:func:`moe_experts` in fp32."""
    check_experts(x, w13, w2, topk_weights, topk_ids, activation)
    return expert_sum(x, topk_weights, topk_ids, lambda rows, e: rows @ w13[e].float().T,
                      lambda rows, e: rows @ w2[e].float().T, activation)


def expert_sum(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
               up: Callable[[torch.Tensor, int], torch.Tensor],
               down: Callable[[torch.Tensor, int], torch.Tensor], activation: str
               ) -> torch.Tensor:
    """The experts' weighted sum in fp32 ``[T, H]``, each chosen expert ``e`` run on its
    tokens' fp32 rows as ``down(act(up(rows, e)), e)`` (``up``: ``[n, H] -> [n, 2I]``,
    ``down``: ``[n, I] -> [n, H]``, both fp32)."""
    act = ACTIVATIONS[activation]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in topk_ids.unique().tolist():
        tokens, slots = (topk_ids == expert).nonzero(as_tuple=True)
        rows = down(act(up(x[tokens].float(), expert)), expert)
        out.index_add_(0, tokens, rows * topk_weights[tokens, slots, None].float())
    return out


def check_shared(shared_w13: torch.Tensor | None, shared_w2: torch.Tensor | None) -> None:
    """Raise :class:`UnsupportedError` unless both shared-expert weights or neither are
    given."""
    if (shared_w13 is None) != (shared_w2 is None):
        raise UnsupportedError("shared experts need both shared_w13 and shared_w2")


def ggml_moe_experts(x: torch.Tensor, w13: torch.Tensor, w13_type: int, w2: torch.Tensor,
                     w2_type: int, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     activation: str = "silu") -> torch.Tensor:
    """:func:`moe_experts` over GGUF blocks: ``w13 uint8 [E, 2I, row_bytes]`` of type
    ``w13_type`` and ``w2 uint8 [E, H, row_bytes]`` of ``w2_type``, each expert's rows as
    the file stores them. Dequantizes the chosen experts only."""
    used, local = topk_ids.unique(return_inverse=True)
    up = dequantize(w13[used].flatten(0, 1), w13_type).view(len(used), w13.shape[1], -1)
    down = dequantize(w2[used].flatten(0, 1), w2_type).view(len(used), w2.shape[1], -1)
    return moe_experts(x, up, down, topk_weights, local, activation)


def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, top_k: int, renormalize: bool = True, *,
              scoring: str = "softmax", correction_bias: torch.Tensor | None = None,
              num_expert_group: int | None = None, topk_group: int | None = None,
              routed_scaling_factor: float = 1.0, activation: str = "silu",
              shared_w13: torch.Tensor | None = None,
              shared_w2: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`moe_topk` then :func:`moe_experts`, plus the shared experts' MLP
    ``shared_w2 @ act_and_mul(shared_w13 @ x)`` (``[2S, H]`` and ``[H, S]``; both or
    neither) added unweighted."""
    weights, ids = moe_topk(router_logits, top_k, renormalize, scoring=scoring,
                            correction_bias=correction_bias, num_expert_group=num_expert_group,
                            topk_group=topk_group, routed_scaling_factor=routed_scaling_factor)
    check_shared(shared_w13, shared_w2)
    out = _experts(x, w13, w2, weights, ids, activation)
    if shared_w13 is not None:
        out += ACTIVATIONS[activation](x.float() @ shared_w13.float().T) @ shared_w2.float().T
    return out.to(x.dtype)
