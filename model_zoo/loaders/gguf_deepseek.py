"""llama.cpp's ``deepseek2`` GGUF files (DeepSeek-V2/V3): the config their metadata states,
and their latent attention's up-projection joined back into transformers' ``kv_b_proj``.

transformers reads no ``deepseek2`` GGUF, so :func:`deepseek_config` builds the
``DeepseekV3Config`` (sigmoid gating, ``expert_gating_func`` 2) or ``DeepseekV2Config``
(softmax) from the ``deepseek2.*`` keys llama.cpp's converter writes: the latent sizes
(``attention.q_lora_rank``, ``attention.kv_lora_rank``, ``attention.key_length_mla`` =
``qk_nope_head_dim + qk_rope_head_dim``, ``attention.value_length_mla`` = ``v_head_dim``,
``rope.dimension_count`` = ``qk_rope_head_dim``) and the experts' (count, used, shared,
``leading_dense_block_count``, weights scale and norm, group count and used groups) and
YaRN RoPE scaling (``rope.scaling.*``: factor, original context, ``yarn_log_multiplier`` =
``0.1 * mscale_all_dim``); other scalings are refused (:class:`~hwplug.errors.ModelError`).

llama.cpp splits each layer's ``kv_b_proj`` ``[H * (nope + v), kv_lora_rank]`` per head into
``attn_k_b`` (``[H, kv_lora_rank, nope]``, transposed for its absorbed decode) and
``attn_v_b`` (``[H, v, kv_lora_rank]``). :class:`LatentUpProjection` joins the two back,
dequantised to float32: the zoo's MLA uses them as ``W_UK``/``W_UV`` in the model's dtype in
any case (:class:`~hwplug.model_zoo.models.deepseek.DeepseekV3Attention`), so a copy in
blocks would be dequantised at the first step anyway. Kept-in-blocks loads hold it as an
F32 ``qweight``; it is small (``H * (nope + v) * kv_lora_rank`` values a layer).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from hwplug.errors import ModelError

if TYPE_CHECKING:
    from gguf import GGUFReader, ReaderTensor
    from transformers import PretrainedConfig

    from hwplug.model_zoo.loaders.gguf_file import ConvertedTensors

#: ``general.architecture`` of DeepSeek-V2/V3 files.
ARCHITECTURE = "deepseek2"
#: ``expert_gating_func`` values (llama.cpp's ``llama_expert_gating_func_type``).
SOFTMAX, SIGMOID = 1, 2
_UP = re.compile(r"^blk\.(?P<layer>\d+)\.attn_(?P<part>k|v)_b\.weight$")


def deepseek_config(reader: GGUFReader, path: str) -> PretrainedConfig:
    """The transformers config of a ``deepseek2`` file (see the module docstring);
    :class:`ModelError` naming the key for a missing size or a RoPE scaling."""
    from transformers import DeepseekV2Config, DeepseekV3Config

    def field(key: str, default: Any = ModelError) -> Any:
        found = reader.fields.get(f"{ARCHITECTURE}.{key}")
        if found is None:
            if default is ModelError:
                raise ModelError(f"{path}: {ARCHITECTURE}.{key} is missing")
            return default
        return found.contents()

    scaling = field("rope.scaling.type", "none")
    if scaling not in ("none", "yarn"):
        raise ModelError(f"{path}: RoPE scaling {scaling!r} is not supported for DeepSeek "
                         "models (supported: none, yarn)")
    if scaling == "yarn":  # llama.cpp writes 0.1 * mscale_all_dim; its mscale is the same
        mscale = float(field("rope.scaling.yarn_log_multiplier", 0.1)) / 0.1
        scaling = dict(rope_type="yarn", factor=float(field("rope.scaling.factor")),
                       original_max_position_embeddings=int(
                           field("rope.scaling.original_context_length")),
                       mscale=mscale, mscale_all_dim=mscale,
                       beta_fast=float(field("rope.scaling.yarn_beta_fast", 32.0)),
                       beta_slow=float(field("rope.scaling.yarn_beta_slow", 1.0)))
    else:
        scaling = None
    rope = int(field("rope.dimension_count"))
    heads = int(field("attention.head_count"))
    gating = int(field("expert_gating_func", SOFTMAX))
    if gating not in (SOFTMAX, SIGMOID):
        raise ModelError(f"{path}: {ARCHITECTURE}.expert_gating_func {gating} is not one of "
                         f"{SOFTMAX} (softmax), {SIGMOID} (sigmoid)")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    values = dict(
        hidden_size=int(field("embedding_length")),
        num_hidden_layers=int(field("block_count")),
        num_attention_heads=heads, num_key_value_heads=heads,
        intermediate_size=int(field("feed_forward_length")),
        max_position_embeddings=int(field("context_length")),
        rms_norm_eps=float(field("attention.layer_norm_rms_epsilon")),
        vocab_size=int(field("vocab_size", len(tokens.data) if tokens is not None else 0)),
        q_lora_rank=(int(q) if (q := field("attention.q_lora_rank", None)) else None),
        kv_lora_rank=int(field("attention.kv_lora_rank")),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=int(field("attention.key_length_mla")) - rope,
        v_head_dim=int(field("attention.value_length_mla")),
        moe_intermediate_size=int(field("expert_feed_forward_length")),
        n_routed_experts=int(field("expert_count")),
        num_experts_per_tok=int(field("expert_used_count")),
        n_shared_experts=int(field("expert_shared_count", 0)),
        first_k_dense_replace=int(field("leading_dense_block_count", 0)),
        routed_scaling_factor=float(field("expert_weights_scale", 1.0)),
        norm_topk_prob=bool(field("expert_weights_norm", False)),
        n_group=int(field("expert_group_count", 1)),
        topk_group=int(field("expert_group_used_count", 1)),
        rope_scaling=scaling, rope_theta=float(field("rope.freq_base", 10000.0)),
        tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
    )
    if gating == SIGMOID:
        return DeepseekV3Config(**values, architectures=["DeepseekV3ForCausalLM"])
    grouped = values["n_group"] > 1
    return DeepseekV2Config(**values, architectures=["DeepseekV2ForCausalLM"],
                            topk_method="group_limited_greedy" if grouped else "greedy")


def deepseek_names(parameter_names: list[str]) -> dict[str, str]:
    """``{gguf tensor name: transformers parameter}`` for what the gguf package's name map
    lacks: the experts' correction bias (``exp_probs_b.bias``)."""
    mapping = {}
    for name in parameter_names:
        if name.endswith(".mlp.gate.e_score_correction_bias"):
            mapping[f"blk.{name.split('.')[2]}.exp_probs_b.bias"] = name
    return mapping


class LatentUpProjection:
    """Joins each layer's ``attn_k_b`` and ``attn_v_b`` into ``kv_b_proj`` (see the module
    docstring); the two wait for each other."""

    def __init__(self, num_heads: int) -> None:
        self.num_heads = num_heads
        self.pending: dict[str, tuple[str, np.ndarray]] = {}

    def take(self, tensor: ReaderTensor, converted: ConvertedTensors,
             dequantize_all: bool) -> bool:
        """Convert ``tensor`` into ``converted`` if it is an ``attn_k_b`` or ``attn_v_b``
        (once both of its layer's have come); whether it was one."""
        match = _UP.match(tensor.name)
        if match is None:
            return False
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        values = values.reshape(self.num_heads, -1, values.shape[-1])
        parameter = f"model.layers.{match['layer']}.self_attn.kv_b_proj"
        other = self.pending.pop(parameter, None)
        if other is None:
            self.pending[parameter] = (match["part"], values)
            return True
        k_b, v_b = (other[1], values) if other[0] == "k" else (values, other[1])
        joined = np.concatenate([k_b.swapaxes(1, 2), v_b], axis=1)
        joined = np.ascontiguousarray(joined.reshape(-1, joined.shape[-1]))
        if dequantize_all:
            converted.written[f"{parameter}.weight"] = torch.from_numpy(joined)
            return True
        converted.written[f"{parameter}.qweight_type"] = torch.tensor(
            [int(GGMLQuantizationType.F32)], dtype=torch.int32)
        converted.repacked[f"{parameter}.qweight"] = joined.view(np.uint8)
        converted.copied[f"{parameter}.qweight"] = (
            "llama.cpp's attn_k_b and attn_v_b joined back, as float32 (used as W_UK/W_UV)")
        return True

    def check_done(self) -> None:
        """Raise :class:`ModelError` naming a layer that has only one of the two."""
        for parameter, (part, _) in self.pending.items():
            raise ModelError(f"{parameter}: the file has attn_{part}_b but not "
                             f"attn_{'v' if part == 'k' else 'k'}_b")


