"""Qwen3 decoder: the Llama blocks plus an RMSNorm over each query and key head before RoPE.

Registered for ``Qwen3ForCausalLM``; checkpoint names add ``self_attn.q_norm.weight`` and
``self_attn.k_norm.weight`` ``[head_dim]`` to the Llama ones.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.layers import RMSNorm, RotaryEmbedding
from hwplug.model_zoo.models.llama import LlamaAttention, LlamaForCausalLM


class Qwen3Attention(LlamaAttention):
    """:class:`LlamaAttention` with per-head ``q_norm`` / ``k_norm`` on the projections."""

    def __init__(self, hf_config: Any, ctx: ModelContext, layer_idx: int,
                 rotary: RotaryEmbedding) -> None:
        super().__init__(hf_config, ctx, layer_idx, rotary)
        self.q_norm = RMSNorm(self.head_size, hf_config.rms_norm_eps, ctx)
        self.k_norm = RMSNorm(self.head_size, hf_config.rms_norm_eps, ctx)

    def _project_qkv(self, hidden: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super()._project_qkv(hidden)
        return self.q_norm(q), self.k_norm(k), v


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 causal LM (same interface as :class:`LlamaForCausalLM`)."""

    attention_cls: ClassVar[type[LlamaAttention]] = Qwen3Attention
