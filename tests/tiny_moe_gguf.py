"""Tiny Qwen3-MoE and Mixtral models written as GGUF files, as llama.cpp's converter writes
them: its tensor names (stacked ``ffn_{gate,up,down}_exps``, ``ffn_gate_inp``), its
``qwen3moe`` metadata, or for Mixtral the ``llama`` architecture with ``expert_count`` and
the query / key rows permuted as llama.cpp's Llama converter does; and
a byte-level GPT-2 tokenizer of :data:`VOCAB` tokens (the 256 bytes and one merge); quantized by llama.cpp's own quantizer."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import torch
from gguf import (
    GGML_QUANT_SIZES,
    MODEL_ARCH,
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFWriter,
    RopeScalingType,
    TokenType,
    get_tensor_name_map,
)
from gguf.quants import quantize

#: transformers' name (after ``model.layers.<i>.``) -> llama.cpp's (after ``blk.<i>.``).
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.experts.down_proj": "ffn_down_exps.weight",
}
#: Vocabulary size of the written files (a model written must have it).
VOCAB = 257
GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: token i is byte i as GPT-2's BPE spells it."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Llama converter's query / key row order (rotary halves interleaved)."""
    return (weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_moe_gguf(model: torch.nn.Module, path: Path) -> Path:
    """Write transformers ``Qwen3MoeForCausalLM`` or ``MixtralForCausalLM`` ``model``
    (vocabulary :data:`VOCAB`, or more: control tokens after them; no mlp-only layers) to
    ``path`` as an F32 GGUF."""
    config = model.config
    mixtral = config.model_type == "mixtral"
    writer = GGUFWriter(path, "llama" if mixtral else "qwen3moe")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_expert_count(config.num_local_experts if mixtral else config.num_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    if not mixtral:
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    _add_vocabulary(writer, config.vocab_size)
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy()
        if name in GLOBAL_NAMES:
            writer.add_tensor(GLOBAL_NAMES[name], data)
            continue
        _, _, layer, rest = name.split(".", 3)
        if mixtral and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
            data = _permute(data, config.num_attention_heads if "q_proj" in rest
                            else config.num_key_value_heads)
        if rest == "mlp.experts.gate_up_proj":
            gate, up = np.split(data, 2, axis=1)
            writer.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(gate))
            writer.add_tensor(f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(up))
        else:
            writer.add_tensor(f"blk.{layer}.{LAYER_NAMES[rest]}", data)
    return _finish(writer, path)


def write_deepseek_gguf(model: torch.nn.Module, path: Path,
                        matrices: GGMLQuantizationType = GGMLQuantizationType.F32) -> Path:
    """Write transformers ``DeepseekV3ForCausalLM`` ``model`` (RoPE plain or YaRN with
    ``mscale == mscale_all_dim``, as llama.cpp assumes; vocabulary
    as for :func:`write_moe_gguf`) to ``path`` as an F32 GGUF the way llama.cpp's converter
    writes ``deepseek2``: MLA metadata (key/value lengths of the latent "head", the
    per-head ``key_length_mla``/``value_length_mla``), sigmoid gating with
    ``exp_probs_b``, grouped top-k, shared experts, and ``kv_b_proj`` split per head into
    ``attn_k_b`` (transposed: ``[H, kv_lora_rank, qk_nope_head_dim]``) and ``attn_v_b``.
    ``matrices``: the type of the 2-D weights whose rows are whole blocks of it (the ``gguf``
    package's quantizer; llama.cpp's makes the K-quants), the rest F32."""
    config = model.config
    writer = GGUFWriter(path, "deepseek2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(1)  # the latent is one head shared by all
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_leading_dense_block_count(config.first_k_dense_replace)
    writer.add_vocab_size(config.vocab_size)
    if config.q_lora_rank:
        writer.add_q_lora_rank(config.q_lora_rank)
    writer.add_kv_lora_rank(config.kv_lora_rank)
    writer.add_key_length(config.kv_lora_rank + config.qk_rope_head_dim)
    writer.add_value_length(config.kv_lora_rank)
    writer.add_key_length_mla(config.qk_nope_head_dim + config.qk_rope_head_dim)
    writer.add_value_length_mla(config.v_head_dim)
    writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_expert_count(config.n_routed_experts)
    writer.add_expert_used_count(config.num_experts_per_tok)
    writer.add_expert_shared_count(config.n_shared_experts)
    writer.add_expert_weights_scale(config.routed_scaling_factor)
    writer.add_expert_weights_norm(bool(config.norm_topk_prob))
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    writer.add_expert_group_count(config.n_group)
    writer.add_expert_group_used_count(config.topk_group)
    writer.add_rope_dimension_count(config.qk_rope_head_dim)
    if config.rope_parameters.get("rope_type") == "yarn":
        yarn = config.rope_parameters
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(yarn["factor"])
        writer.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * yarn["mscale_all_dim"])
    _add_vocabulary(writer, config.vocab_size)
    names = get_tensor_name_map(MODEL_ARCH.DEEPSEEK2, config.num_hidden_layers)
    heads, nope = config.num_attention_heads, config.qk_nope_head_dim
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy()
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("kv_b_proj.weight"):
            per_head = data.reshape(heads, nope + config.v_head_dim, -1)
            writer.add_tensor(f"blk.{layer}.attn_k_b.weight",
                              np.ascontiguousarray(per_head[:, :nope].swapaxes(1, 2)))
            writer.add_tensor(f"blk.{layer}.attn_v_b.weight",
                              np.ascontiguousarray(per_head[:, nope:]))
        elif name.endswith("e_score_correction_bias"):
            writer.add_tensor(f"blk.{layer}.exp_probs_b.bias", data)
        elif name.endswith("experts.gate_up_proj"):
            gate, up = np.split(data, 2, axis=1)
            writer.add_tensor(f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(gate))
            writer.add_tensor(f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(up))
        elif name.endswith("experts.down_proj"):
            writer.add_tensor(f"blk.{layer}.ffn_down_exps.weight", data)
        else:
            gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
            block = GGML_QUANT_SIZES[matrices][0]
            if data.ndim == 2 and data.shape[1] % block == 0 and matrices != GGMLQuantizationType.F32:
                writer.add_tensor(gguf_name, quantize(data, matrices), raw_dtype=matrices)
            else:
                writer.add_tensor(gguf_name, data)
    return _finish(writer, path)


def _add_vocabulary(writer: GGUFWriter, vocab_size: int) -> None:
    """The byte-level GPT-2 tokenizer of :data:`VOCAB` tokens, control tokens up to
    ``vocab_size``."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    tokens = _byte_tokens()
    pads = vocab_size - VOCAB  # control tokens past the first VOCAB
    writer.add_token_list([*tokens, tokens[32] * 2,  # llama.cpp needs a merge
                           *(f"<|pad{i}|>" for i in range(pads))])
    writer.add_token_types([TokenType.NORMAL] * VOCAB + [TokenType.CONTROL] * pads)
    writer.add_token_merges([f"{tokens[32]} {tokens[32]}"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)


def _finish(writer: GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def quantize_gguf(source: Path, out: Path, file_type: str) -> Path:
    """``source`` quantized by llama.cpp (``llama_model_quantize``, file type
    ``LLAMA_FTYPE_MOSTLY_<file_type>``) into ``out``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(out).encode(),
                                            ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize -> {file_type} returned {status}")
    return out


def llama_cpp_greedy(path: Path, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``prompt`` by llama.cpp (argmax of its logits, end
    tokens included)."""
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False)
    tokens = list(prompt)
    llm.eval(tokens)
    out = []
    for _ in range(steps):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out


def hwplug_greedy(path: Path, prompt: list[int], steps: int, dequantize_all: bool = False
                  ) -> tuple[list[int], torch.Tensor]:
    """hwplug's ``steps`` greedy tokens after ``prompt`` from the GGUF at ``path`` (kept in
    blocks unless ``dequantize_all``) and its prefill logits ``[len(prompt), vocab]``."""
    from model_harness import PagedBatch

    from hwplug.model_zoo.context import build_model
    from hwplug.model_zoo.loaders import load_checkpoint

    model, ctx = build_model(load_checkpoint(path, dequantize=dequantize_all), dtype="float32",
                             block_size=8)
    batch = PagedBatch(ctx, model.num_layers, 1, len(prompt) + steps)
    tokens = torch.tensor(prompt)
    prefill = logits = model.compute_logits(batch.run(model, [tokens], [len(tokens)]))
    for _ in range(steps):
        tokens = torch.cat([tokens, logits[-1:].argmax(-1)])
        logits = model.compute_logits(batch.run(model, [tokens[-1:]], [len(tokens)]))
    return tokens[len(prompt):].tolist(), prefill
