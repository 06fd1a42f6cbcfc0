"""DeepSeek-V3 (and V2-shaped configs): multi-head latent attention over a latent cache,
and a mixture of experts with sigmoid routing, a correction bias, grouped top-k and a
shared expert.

Registered for ``DeepseekV3ForCausalLM`` and ``DeepseekV2ForCausalLM`` (the same blocks;
V2 routes by softmax, see :func:`moe_routing`). Attention projects the hidden state to a latent
``c_kv`` (``kv_lora_rank``) plus one shared rotary key (``qk_rope_head_dim``); queries come
from ``q_proj`` or, with ``q_lora_rank``, ``q_b_proj(norm(q_a_proj))``. The cache holds only
the normalised latent and the roped shared key (layout ``MLA``, ``kv_lora_rank +
qk_rope_head_dim`` values per token and layer); ``kv_b_proj``, split per head into ``W_UK``
and ``W_UV``, expands it in prefill and is absorbed into the query and the output in
decode (:class:`~hwplug.model_zoo.layers.MLAAttention`, an MLA backend); a quantized
``kv_b_proj`` is dequantized once for it. Under tensor parallelism the heads split evenly
over the ranks (queries, ``kv_b_proj`` and ``o_proj`` by head; the latent is every rank's). RoPE pairs interleaved dimensions (``rope_interleave``, gptj order) or
halves; with YaRN scaling (DeepSeek-V3's own config) the softmax scale grows by
``yarn_mscale(factor, mscale_all_dim) ** 2``, as in DeepSeek's reference code. Layers below
``first_k_dense_replace`` have a dense MLP.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hwplug.attention import AttentionMetadata
from hwplug.config import EngineConfig
from hwplug.errors import ModelError
from hwplug.kernel_registry.reference.rotary import yarn_mscale
from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.layers import Linear, MLAAttention, RMSNorm, RotaryEmbedding
from hwplug.model_zoo.layers.moe import FusedMoE
from hwplug.model_zoo.layers.rotary import rope_parameters
from hwplug.model_zoo.layers.weights import Target
from hwplug.model_zoo.models.llama import LlamaForCausalLM, dense_mlp
from hwplug.model_zoo.models.moe import MoeWeights

__all__ = ["DeepseekV3Attention", "DeepseekV3ForCausalLM", "moe_routing"]


class DeepseekV3Attention(nn.Module):
    """Latent attention over the latent cache (see the module docstring).

    ``forward(positions [T], hidden [T, hidden], kv_cache, metadata) -> [T, hidden]``.
    """

    def __init__(self, hf_config: Any, ctx: ModelContext, layer_idx: int,
                 rotary: RotaryEmbedding) -> None:
        super().__init__()
        heads, hidden = hf_config.num_attention_heads, hf_config.hidden_size
        _, self.num_heads = ctx.parallel.share(heads, "attention heads")  # this rank's
        self.nope, self.rope = hf_config.qk_nope_head_dim, hf_config.qk_rope_head_dim
        self.v_head, self.kv_lora = hf_config.v_head_dim, hf_config.kv_lora_rank
        bias = bool(getattr(hf_config, "attention_bias", False))
        q_rows = heads * (self.nope + self.rope)
        # under tensor parallelism each rank projects its heads' rows (column shares, whole
        # heads: the head count splits evenly) from the latents every rank computes and
        # caches; o_proj sums the ranks' heads (row parallel)
        if hf_config.q_lora_rank:
            self.q_a_proj = Linear(hidden, hf_config.q_lora_rank, ctx, bias=bias)
            self.q_a_layernorm = RMSNorm(hf_config.q_lora_rank, hf_config.rms_norm_eps, ctx)
            self.q_b_proj = Linear(hf_config.q_lora_rank, q_rows, ctx, parallel="column")
        else:
            self.q_proj = Linear(hidden, q_rows, ctx, parallel="column")
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora + self.rope, ctx, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, hf_config.rms_norm_eps, ctx)
        self.kv_b_proj = Linear(self.kv_lora, heads * (self.nope + self.v_head), ctx,
                                parallel="column")
        self.o_proj = Linear(heads * self.v_head, hidden, ctx, bias=bias, parallel="row")
        #: ``kv_b_proj`` dequantized, once, when its quant method stores it otherwise.
        self._w_kv_b: torch.Tensor | None = None
        self._dtype = ctx.dtype
        self.rotary_emb = rotary
        self.attn = MLAAttention(ctx, self.num_heads, self.kv_lora, self.rope,
                                 scale=(self.nope + self.rope) ** -0.5 * _mscale(hf_config) ** 2)

    @staticmethod
    def rope_is_neox(hf_config: Any) -> bool:
        """DeepSeek rotates interleaved pairs (gptj order) unless ``rope_interleave`` is
        false."""
        return getattr(hf_config, "rope_interleave", True) is False

    def _queries(self, hidden: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(hidden)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))

    def _up_projections(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``W_UK [H, N, L]`` and ``W_UV [H, V, L]``: views of ``kv_b_proj``'s weight, or of
        its quant method's ``dequantize`` (in the model dtype, made on the first call:
        weights are read-only after loading)."""
        weight = getattr(self.kv_b_proj, "weight", None)
        if weight is None or weight.dtype != self._dtype:
            if self._w_kv_b is None:
                layer = self.kv_b_proj
                self._w_kv_b = layer.quant_method.dequantize(layer).to(self._dtype)
            weight = self._w_kv_b
        per_head = weight.view(self.num_heads, self.nope + self.v_head, self.kv_lora)
        w_uk, w_uv = per_head.split([self.nope, self.v_head], dim=1)
        return w_uk, w_uv

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        tokens = hidden.shape[0]
        q = self._queries(hidden).view(tokens, self.num_heads, self.nope + self.rope)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden).split([self.kv_lora, self.rope], -1)
        q_nope, q_pe = q.split([self.nope, self.rope], -1)
        q_pe, k_pe = self.rotary_emb(positions, q_pe.contiguous(),
                                     k_pe.reshape(tokens, 1, self.rope).contiguous())
        out = self.attn(q_nope, q_pe, self.kv_a_layernorm(latent), k_pe.view(tokens, -1),
                        kv_cache, metadata, *self._up_projections())
        return self.o_proj(out)


def _mscale(hf_config: Any) -> float:
    """YaRN's softmax scale correction (its square multiplies the scale): 1 without YaRN or
    without ``mscale_all_dim``."""
    _, scaling, _ = rope_parameters(hf_config)
    if not scaling or scaling["rope_type"] != "yarn" or not scaling.get("mscale_all_dim"):
        return 1.0
    return yarn_mscale(scaling["factor"], scaling["mscale_all_dim"])


def moe_routing(hf_config: Any) -> dict[str, Any]:
    """:class:`FusedMoE`'s routing options of a DeepSeek config: V3's sigmoid scores with a
    correction bias and grouped top-k (a group scored by its best two); V2's softmax over
    all experts, never renormalised, grouped (a group scored by its best) for
    ``topk_method`` ``group_limited_greedy``. transformers masks the other groups' scores
    to 0 in V2, to -inf in V3: the same choice, softmax scores being positive."""
    if hf_config.model_type == "deepseek_v2":
        method = hf_config.topk_method
        if method not in ("greedy", "group_limited_greedy"):
            raise ModelError(f"DeepSeek-V2 topk_method {method!r} is not one of greedy, "
                             "group_limited_greedy")
        grouped = method == "group_limited_greedy"
        return dict(scoring="softmax", renormalize=False,
                    num_expert_group=hf_config.n_group if grouped else None,
                    topk_group=hf_config.topk_group if grouped else None)
    return dict(scoring="sigmoid", renormalize=bool(hf_config.norm_topk_prob),
                correction_bias=True, num_expert_group=hf_config.n_group,
                topk_group=hf_config.topk_group)


class DeepseekV3ForCausalLM(MoeWeights, LlamaForCausalLM):
    """DeepSeek-V3 (and V2) causal LM (same interface as :class:`LlamaForCausalLM`)."""

    attention_cls = DeepseekV3Attention  # type: ignore[assignment]

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        _, scaling, _ = rope_parameters(hf_config)
        if scaling and scaling["rope_type"] != "yarn":
            raise ModelError(f"DeepSeek RoPE scaling {scaling!r} is not supported (supported: "
                             "none, yarn)")
        self.num_experts = hf_config.n_routed_experts
        super().__init__(hf_config, ctx)

    @staticmethod
    def make_mlp(hf_config: Any, ctx: ModelContext, layer_idx: int) -> nn.Module:
        if layer_idx < hf_config.first_k_dense_replace:
            return dense_mlp(hf_config, ctx, layer_idx)
        shared = hf_config.n_shared_experts
        return FusedMoE(ctx, num_experts=hf_config.n_routed_experts,
                        top_k=hf_config.num_experts_per_tok,
                        hidden_size=hf_config.hidden_size,
                        intermediate_size=hf_config.moe_intermediate_size,
                        shared_intermediate_size=(hf_config.moe_intermediate_size * shared
                                                  if shared else None),
                        routed_scaling_factor=hf_config.routed_scaling_factor,
                        **moe_routing(hf_config))

    def _checkpoint_target(self, name: str) -> Target | None:
        """Llama's, except ``q_proj`` (without ``q_lora_rank``) is a layer of its own, not
        a shard of a fused q/k/v projection."""
        if name.endswith(".self_attn.q_proj.weight"):
            return name, None
        return super()._checkpoint_target(name)

    @staticmethod
    def engine_config(hf_config: Any, dtype: str) -> EngineConfig:
        """Latent attention: one cached latent "head" of ``kv_lora_rank +
        qk_rope_head_dim`` per token."""
        return EngineConfig(num_heads=hf_config.num_attention_heads, num_kv_heads=1,
                            dtype=dtype, is_mla=True,
                            head_size=hf_config.kv_lora_rank + hf_config.qk_rope_head_dim)
