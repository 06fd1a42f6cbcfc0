"""BERT encoder (``BertModel``): token hidden states for sentence embeddings.

Embeddings (word + absolute position + token type, then LayerNorm), post-norm encoder
layers with bidirectional attention through the paged attention backend, GELU MLP. Loads
Hugging Face / sentence-transformers names (``embeddings.word_embeddings.weight``,
``encoder.layer.N.attention.self.query.weight``, ...), with or without a ``bert.``
prefix; the pooler and task heads are not used (the engine mean-pools) and are skipped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from hwplug.attention import AttentionMetadata
from hwplug.config import EngineConfig
from hwplug.errors import ConfigError, ModelError
from hwplug.model_zoo.context import ModelContext
from hwplug.model_zoo.layers import (
    Attention,
    FusedLinear,
    Linear,
    VocabEmbedding,
    load_named_weights,
)
from hwplug.model_zoo.layers.weights import Target

#: Module paths under ``encoder.layer.N`` in a checkpoint -> (module of :class:`BertLayer`,
#: shard).
LAYER_MODULES: dict[str, Target] = {
    "attention.self.query": ("qkv_proj", "q"),
    "attention.self.key": ("qkv_proj", "k"),
    "attention.self.value": ("qkv_proj", "v"),
    "attention.output.dense": ("attn_output", None),
    "attention.output.LayerNorm": ("attn_norm", None),
    "intermediate.dense": ("intermediate", None),
    "output.dense": ("output", None),
    "output.LayerNorm": ("output_norm", None),
}
#: Checkpoint tensors the encoder does not use: the pooler, task heads, a position-id buffer.
SKIPPED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")


class BertEmbeddings(nn.Module):
    """``word[ids] + position[positions] + token_type[types]``, then LayerNorm."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        hidden = hf_config.hidden_size
        self.word_embeddings = VocabEmbedding(hf_config.vocab_size, hidden, ctx)
        self.position_embeddings = VocabEmbedding(hf_config.max_position_embeddings, hidden,
                                                  ctx)
        self.token_type_embeddings = VocabEmbedding(hf_config.type_vocab_size, hidden, ctx)
        self.norm = nn.LayerNorm(hidden, eps=hf_config.layer_norm_eps, dtype=ctx.dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None) -> torch.Tensor:
        types = (self.token_type_embeddings.weight[0] if token_type_ids is None
                 else self.token_type_embeddings(token_type_ids))
        return self.norm(self.word_embeddings(input_ids) + self.position_embeddings(positions)
                         + types)


class BertLayer(nn.Module):
    """Post-norm block: ``x = norm(x + attn(x)); x = norm(x + mlp(x))``."""

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        hidden, heads = hf_config.hidden_size, hf_config.num_attention_heads
        eps = hf_config.layer_norm_eps
        self.qkv_proj = FusedLinear(hidden, {"q": hidden, "k": hidden, "v": hidden}, ctx,
                                    bias=True)
        self.attn = Attention(ctx, heads, heads, hidden // heads)
        self.attn_output = Linear(hidden, hidden, ctx, bias=True)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps, dtype=ctx.dtype)
        self.intermediate = Linear(hidden, hf_config.intermediate_size, ctx, bias=True)
        self.act = ACT2FN[hf_config.hidden_act]
        self.output = Linear(hf_config.intermediate_size, hidden, ctx, bias=True)
        self.output_norm = nn.LayerNorm(hidden, eps=eps, dtype=ctx.dtype)

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(hidden))
        hidden = self.attn_norm(hidden + self.attn_output(self.attn(q, k, v, kv_cache, metadata)))
        return self.output_norm(hidden + self.output(self.act(self.intermediate(hidden))))


class BertModel(nn.Module):
    """The model-zoo encoder interface: ``forward(input_ids [T], positions [T], kv_caches,
    metadata, token_type_ids [T] | None) -> hidden [T, hidden]`` (no pooling)."""

    is_encoder = True

    def __init__(self, hf_config: Any, ctx: ModelContext) -> None:
        super().__init__()
        if ctx.parallel.size > 1:
            raise ConfigError("BertModel runs on one rank: tensor parallelism is for decoders")
        embedding_type = getattr(hf_config, "position_embedding_type", "absolute")
        if embedding_type != "absolute":
            raise ModelError(f"BertModel supports absolute position embeddings, "
                             f"not {embedding_type!r}")
        self.num_layers = hf_config.num_hidden_layers
        self.embeddings = BertEmbeddings(hf_config, ctx)
        self.layers = nn.ModuleList(BertLayer(hf_config, ctx) for _ in range(self.num_layers))

    @staticmethod
    def engine_config(hf_config: Any, dtype: str) -> EngineConfig:
        heads = hf_config.num_attention_heads
        return EngineConfig(num_heads=heads, num_kv_heads=heads,
                            head_size=hf_config.hidden_size // heads, dtype=dtype, causal=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], metadata: AttentionMetadata,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embeddings(input_ids, positions, token_type_ids)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, kv_cache, metadata)
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_named_weights(self, weights, _checkpoint_target)


def _checkpoint_target(name: str) -> Target | None:
    name = name.removeprefix("bert.")
    if name.startswith(SKIPPED_PREFIXES):
        return None
    if name.startswith("embeddings.LayerNorm."):
        return name.replace("LayerNorm", "norm"), None
    if not name.startswith("encoder.layer."):
        return name, None
    index, _, rest = name.removeprefix("encoder.layer.").partition(".")
    module_path, _, param = rest.rpartition(".")
    if module_path not in LAYER_MODULES:
        return name, None  # reported as unexpected
    module, shard = LAYER_MODULES[module_path]
    return f"layers.{index}.{module}.{param}", shard
