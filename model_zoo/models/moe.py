"""Mixture-of-experts decoders: Qwen3-MoE and Mixtral, the Llama blocks with a
:class:`~hwplug.model_zoo.layers.moe.FusedMoE` in place of the dense MLP.

Registered for ``Qwen3MoeForCausalLM`` (Qwen3's attention with q/k norms; sparse layers
where ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in ``mlp_only_layers``, a
dense MLP of ``intermediate_size`` elsewhere; ``norm_topk_prob`` renormalises) and
``MixtralForCausalLM`` (Llama/Mistral attention, every layer sparse, always
renormalised). Both route by softmax over ``E`` experts to the top ``k``. Checkpoints load
in transformers' stacked names (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``,
``mlp.gate.weight``) or the per-expert names of the published checkpoints
(``mlp.experts.<e>.gate_proj.weight``...; Mixtral's ``block_sparse_moe.experts.<e>.w1``...).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from hwplug.errors import ModelError
from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.layers import load_named_weights
from hwplug.model_zoo.layers.moe import FusedMoE, stack_experts
from hwplug.model_zoo.models.llama import LlamaForCausalLM, dense_mlp
from hwplug.model_zoo.models.qwen3 import Qwen3ForCausalLM

__all__ = ["MixtralForCausalLM", "MoeWeights", "Qwen3MoeForCausalLM", "sparse_moe"]


def sparse_moe(hf_config: Any, ctx: ModelContext, *, num_experts: int,
               renormalize: bool) -> FusedMoE:
    """The softmax-routed :class:`FusedMoE` block of ``hf_config``'s sizes."""
    if hf_config.hidden_act != "silu":
        raise ModelError(f"mixture-of-experts blocks support hidden_act 'silu', not "
                         f"{hf_config.hidden_act!r}")
    intermediate = getattr(hf_config, "moe_intermediate_size", None) or \
        hf_config.intermediate_size
    return FusedMoE(ctx, num_experts=num_experts, top_k=hf_config.num_experts_per_tok,
                    hidden_size=hf_config.hidden_size, intermediate_size=intermediate,
                    renormalize=renormalize)


class MoeWeights:
    """Loads checkpoints whose experts come stacked or one tensor per expert."""

    num_experts: int

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        stacked = stack_experts(self._renamed(weights), self.num_experts)
        load_named_weights(self, stacked, self._checkpoint_target)  # type: ignore[arg-type]

    def _renamed(self, weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(weights)


class Qwen3MoeForCausalLM(MoeWeights, Qwen3ForCausalLM):
    """Qwen3-MoE causal LM (same interface as :class:`LlamaForCausalLM`)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        self.num_experts = hf_config.num_experts
        super().__init__(hf_config, ctx)

    @staticmethod
    def make_mlp(hf_config: Any, ctx: ModelContext, layer_idx: int) -> nn.Module:
        sparse = (layer_idx not in (getattr(hf_config, "mlp_only_layers", None) or ())
                  and hf_config.num_experts > 0
                  and (layer_idx + 1) % hf_config.decoder_sparse_step == 0)
        if not sparse:
            return dense_mlp(hf_config, ctx, layer_idx)
        return sparse_moe(hf_config, ctx, num_experts=hf_config.num_experts,
                          renormalize=bool(hf_config.norm_topk_prob))


class MixtralForCausalLM(MoeWeights, LlamaForCausalLM):
    """Mixtral causal LM (same interface as :class:`LlamaForCausalLM`)."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        self.num_experts = hf_config.num_local_experts
        super().__init__(hf_config, ctx)

    @staticmethod
    def make_mlp(hf_config: Any, ctx: ModelContext, layer_idx: int) -> nn.Module:
        return sparse_moe(hf_config, ctx, num_experts=hf_config.num_local_experts,
                          renormalize=True)

    def _renamed(self, weights: Iterable[tuple[str, torch.Tensor]]
                 ) -> Iterator[tuple[str, torch.Tensor]]:
        """The published checkpoints' ``block_sparse_moe`` is transformers' ``mlp``."""
        for name, tensor in weights:
            yield name.replace(".block_sparse_moe.", ".mlp."), tensor
