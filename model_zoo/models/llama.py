"""Llama-family decoders: Llama 2/3 (incl. llama3 RoPE scaling), SmolLM2, Mistral, Qwen2.

Registered for ``LlamaForCausalLM``, ``MistralForCausalLM`` and ``Qwen2ForCausalLM``; the
differences are read from the Hugging Face config: QKV bias (``attention_bias``, always on
for Qwen2), per-layer sliding windows (Mistral's ``sliding_window``; Qwen2's
``use_sliding_window`` / ``max_window_layers`` through ``layer_types``), explicit
``head_dim``, partial rotary. Other decoders reuse these blocks by subclassing (see
:mod:`hwplug.model_zoo.models.qwen3`). Parameter names follow Hugging Face except the fused
``qkv_proj`` (q/k/v_proj) and ``gate_up_proj`` (gate/up_proj).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from hwplug.attention import AttentionMetadata
from hwplug.config import EngineConfig
from hwplug.errors import ModelError
from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.layers import (
    Attention,
    FusedLinear,
    Linear,
    LMHead,
    RMSNorm,
    RotaryEmbedding,
    SiluAndMul,
    VocabEmbedding,
    fused_target,
    load_named_weights,
)
from hwplug.model_zoo.layers.attention import kv_scale_target
from hwplug.model_zoo.layers.weights import Target

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaForCausalLM", "LlamaMLP", "LlamaModel",
           "MakeMLP", "dense_mlp"]

#: Checkpoint module names that load into a shard of a fused module.
FUSED_MODULES = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
}
#: Builds layer ``layer_idx``'s MLP block: ``(hf_config, ctx, layer_idx) -> module``.
MakeMLP = Callable[[Any, ModelContext, int], nn.Module]
#: Model types whose q/k/v projections always carry a bias, whatever ``attention_bias`` says.
QKV_BIAS_MODEL_TYPES = ("qwen2",)


def head_size(hf_config: Any) -> int:
    """``head_dim`` when the config states it, else ``hidden_size // num_attention_heads``."""
    return (getattr(hf_config, "head_dim", None)
            or hf_config.hidden_size // hf_config.num_attention_heads)


def layer_sliding_window(hf_config: Any, layer_idx: int) -> int | None:
    """The sliding window of layer ``layer_idx`` as transformers applies it, or None.

    A config with ``layer_types`` windows exactly its ``"sliding_attention"`` layers (Qwen2
    derives them from ``use_sliding_window`` and ``max_window_layers``); one without
    windows every layer when ``sliding_window`` is set (Mistral).
    """
    window = getattr(hf_config, "sliding_window", None)
    if window is None or getattr(hf_config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    return window


class LlamaAttention(nn.Module):
    """Fused QKV projection, RoPE, paged attention, output projection.

    ``forward(positions [T], hidden [T, hidden], kv_cache, metadata) -> [T, hidden]``.
    """

    def __init__(self, hf_config: Any, ctx: ModelContext, layer_idx: int,
                 rotary: RotaryEmbedding) -> None:
        super().__init__()
        hidden, size = hf_config.hidden_size, head_size(hf_config)
        total_heads, total_kv_heads = (hf_config.num_attention_heads,
                                       hf_config.num_key_value_heads)
        first_head, self.num_heads = ctx.parallel.share(total_heads, "attention heads")
        first_kv_head, self.num_kv_heads = ctx.parallel.kv_heads(total_heads, total_kv_heads)
        self.head_size = size
        attention_bias = getattr(hf_config, "attention_bias", False)
        kv_rows = (first_kv_head * size, self.num_kv_heads * size, total_kv_heads * size)
        self.qkv_proj = FusedLinear(
            hidden, {"q": self.num_heads * size, "k": kv_rows[1], "v": kv_rows[1]}, ctx,
            bias=attention_bias or hf_config.model_type in QKV_BIAS_MODEL_TYPES,
            source_rows={"q": (first_head * size, self.num_heads * size, total_heads * size),
                         "k": kv_rows, "v": kv_rows} if ctx.parallel.size > 1 else None)
        self.o_proj = Linear(total_heads * size, hidden, ctx, bias=attention_bias,
                             parallel="row")
        self.rotary_emb = rotary
        self.attn = Attention(ctx, self.num_heads, self.num_kv_heads, self.head_size,
                              sliding_window=layer_sliding_window(hf_config, layer_idx))

    @staticmethod
    def rope_is_neox(hf_config: Any) -> bool:
        """Whether the model's shared RoPE pairs halves (neox) rather than neighbours."""
        return True

    def _project_qkv(self, hidden: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hidden [T, hidden]`` -> q ``[T, Hq, D]``, k and v ``[T, Hkv, D]`` (pre-RoPE)."""
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        return (q.view(-1, self.num_heads, self.head_size),
                k.view(-1, self.num_kv_heads, self.head_size),
                v.view(-1, self.num_kv_heads, self.head_size))

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self._project_qkv(hidden)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, metadata))


class LlamaMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up in one fused matmul."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        if hf_config.hidden_act != "silu":
            raise ModelError(f"{type(self).__name__} supports hidden_act 'silu', "
                             f"not {hf_config.hidden_act!r}")
        bias = getattr(hf_config, "mlp_bias", False)
        hidden, intermediate = hf_config.hidden_size, hf_config.intermediate_size
        first, local = ctx.parallel.share(intermediate, "intermediate size")
        rows = (first, local, intermediate)
        self.gate_up_proj = FusedLinear(
            hidden, {"gate": local, "up": local}, ctx, bias=bias,
            source_rows={"gate": rows, "up": rows} if ctx.parallel.size > 1 else None)
        self.act = SiluAndMul(ctx)
        self.down_proj = Linear(intermediate, hidden, ctx, bias=bias, parallel="row")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


def dense_mlp(hf_config: Any, ctx: ModelContext, layer_idx: int) -> nn.Module:
    """:class:`LlamaMLP` for every layer (the default :data:`MakeMLP`)."""
    return LlamaMLP(hf_config, ctx)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; the residual add is fused into the norms. The MLP
    block is ``make_mlp(hf_config, ctx, layer_idx)`` (default :func:`dense_mlp`).

    ``forward(positions, hidden, residual, kv_cache, metadata) -> (hidden, residual)``;
    pass ``residual=None`` to the first layer (``hidden`` is then the embedding output).
    """

    def __init__(self, hf_config: Any, ctx: ModelContext, layer_idx: int,
                 rotary: RotaryEmbedding, attention_cls: type[LlamaAttention],
                 make_mlp: MakeMLP | None = None) -> None:
        super().__init__()
        eps = hf_config.rms_norm_eps
        self.input_layernorm = RMSNorm(hf_config.hidden_size, eps, ctx)
        self.self_attn = attention_cls(hf_config, ctx, layer_idx, rotary)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, eps, ctx)
        self.mlp = (make_mlp or dense_mlp)(hf_config, ctx, layer_idx)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers (one shared RoPE cache), final norm."""

    def __init__(self, hf_config: Any, ctx: ModelContext,
                 attention_cls: type[LlamaAttention], make_mlp: MakeMLP | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(hf_config.vocab_size, hf_config.hidden_size, ctx,
                                           ctx.parallel, ctx.quant_method)
        rotary = RotaryEmbedding.from_config(hf_config, head_size(hf_config),
                                             attention_cls.rope_is_neox(hf_config), ctx=ctx)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(hf_config, ctx, i, rotary, attention_cls, make_mlp)
            for i in range(hf_config.num_hidden_layers))
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps, ctx)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, metadata)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Causal LM over :class:`LlamaModel` (the model-zoo causal-LM interface).

    ``forward(input_ids [T], positions [T], kv_caches, metadata) -> hidden [T, hidden]``
    with ``kv_caches[i]`` layer i's cache; ``compute_logits(hidden [N, hidden]) -> [N,
    vocab]`` float32; ``load_weights`` takes Hugging Face names.
    """

    #: The attention block; subclasses swap it (Qwen3 adds q/k norms).
    attention_cls: ClassVar[type[LlamaAttention]] = LlamaAttention

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        self.num_layers = hf_config.num_hidden_layers
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.model = LlamaModel(hf_config, ctx, self.attention_cls, self.make_mlp)
        self.lm_head = LMHead(hf_config.vocab_size, hf_config.hidden_size, ctx,
                              tied_to=self.model.embed_tokens if self.tie_word_embeddings
                              else None, parallel=ctx.parallel, quant_method=ctx.quant_method)

    @staticmethod
    def make_mlp(hf_config: Any, ctx: ModelContext, layer_idx: int) -> nn.Module:
        """Layer ``layer_idx``'s MLP block (subclasses swap it: mixtures of experts)."""
        return dense_mlp(hf_config, ctx, layer_idx)

    @staticmethod
    def engine_config(hf_config: Any, dtype: str) -> EngineConfig:
        """Attention geometry: heads, head size, and the window of the windowed layers."""
        windows = {layer_sliding_window(hf_config, i) for i in range(hf_config.num_hidden_layers)}
        windows.discard(None)
        if len(windows) > 1:
            raise ModelError(f"layers use different sliding windows {sorted(windows)}; "
                             "one model supports a single window size")
        return EngineConfig(num_heads=hf_config.num_attention_heads,
                            num_kv_heads=hf_config.num_key_value_heads,
                            head_size=head_size(hf_config), dtype=dtype,
                            sliding_window=windows.pop() if windows else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self, weights, self._checkpoint_target)

    def _checkpoint_target(self, name: str) -> Target | None:
        if name.endswith("rotary_emb.inv_freq"):  # recomputed, never loaded
            return None
        if self.tie_word_embeddings and name == "lm_head.weight":  # same tensor as the embedding
            return None
        return kv_scale_target(name) or fused_target(name, FUSED_MODULES)
