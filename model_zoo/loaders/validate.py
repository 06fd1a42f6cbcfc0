"""Checking a checkpoint before anything is allocated: its sizes, and that its tensors agree.

Every size a config states (:data:`SIZE_LIMITS`: layers, hidden size, heads, vocabulary,
context length, ...) must be a positive integer no larger than its limit, far above any
published model, so a corrupt value fails here instead of allocating or looping for hours.
The tensors present must then agree with the config: their layer indices are exactly
``0 .. num_hidden_layers - 1`` (a config claiming fewer layers would silently drop the
others), the embeddings are ``vocab_size x hidden_size``, the query and key projections
have ``heads * head_dim`` rows, the MLP's ``intermediate_size`` (:data:`SHAPE_RULES`), and
no tensor has a zero-sized dimension.
Both loaders run these checks: the GGUF loader on the file's metadata before converting it,
the directory loader on ``config.json`` and the safetensors headers. Each problem raises
:class:`~hwplug.errors.ModelError` naming the checkpoint, and the tensor and file where one
is involved.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwplug.errors import ModelError

#: The largest value accepted for each size a config may state.
SIZE_LIMITS: dict[str, int] = {
    "num_hidden_layers": 1024,            # published models: under 200
    "hidden_size": 1 << 17,               # under 30k
    "intermediate_size": 1 << 20,         # under 100k
    "moe_intermediate_size": 1 << 20,     # an expert's (Qwen-MoE, DeepSeek): under 10k
    "num_attention_heads": 1024,          # under 256
    "num_key_value_heads": 1024,
    "head_dim": 2048,                     # under 512
    "vocab_size": 1 << 22,                # under 300k
    "max_position_embeddings": 1 << 24,   # contexts under 10M tokens
    "type_vocab_size": 1 << 10,           # BERT: 2
}
#: A tensor name's layer index: ``model.layers.3.``, ``encoder.layer.3.``, GGUF ``blk.3.``.
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|layer|blk)\.(\d+)\.")

Sizes = Mapping[str, int]
Rule = tuple[int, str, Callable[[Sizes], "int | None"]]
_VOCAB: Rule = (0, "vocab_size", lambda s: s.get("vocab_size"))
_HIDDEN: Rule = (1, "hidden_size", lambda s: s.get("hidden_size"))
_Q_ROWS: Rule = (0, "num_attention_heads * head_dim",
                 lambda s: _product(s.get("num_attention_heads"), s.get("head_dim")))
_KV_ROWS: Rule = (0, "num_key_value_heads * head_dim",
                  lambda s: _product(s.get("num_key_value_heads"), s.get("head_dim")))
_FFN_ROWS: Rule = (0, "intermediate_size", lambda s: s.get("intermediate_size"))
_FFN_COLUMNS: Rule = (1, "intermediate_size", lambda s: s.get("intermediate_size"))
#: Tensor-name suffix (transformers or GGUF naming; matched after a ``.`` or as the whole
#: name) -> the rules its shape obeys: ``(dim, what it equals in words, how to compute it
#: from the sizes)``, skipped where the sizes do not state it.
SHAPE_RULES: dict[str, tuple[Rule, ...]] = {
    suffix: rules for suffixes, rules in (
        (("embed_tokens.weight", "word_embeddings.weight", "token_embd.weight",
          "lm_head.weight", "output.weight"), (_VOCAB, _HIDDEN)),
        (("q_proj.weight", "attn_q.weight", "attention.self.query.weight"), (_Q_ROWS,)),
        (("k_proj.weight", "v_proj.weight", "attn_k.weight", "attn_v.weight",
          "attention.self.key.weight", "attention.self.value.weight"), (_KV_ROWS,)),
        (("gate_proj.weight", "up_proj.weight", "ffn_gate.weight", "ffn_up.weight",
          "intermediate.dense.weight"), (_FFN_ROWS,)),
        (("down_proj.weight", "ffn_down.weight"), (_FFN_COLUMNS,)),
        (("position_embeddings.weight",),
         ((0, "max_position_embeddings", lambda s: s.get("max_position_embeddings")),)),
        (("token_type_embeddings.weight",),
         ((0, "type_vocab_size", lambda s: s.get("type_vocab_size")),)),
    ) for suffix in suffixes}


@dataclass(frozen=True)
class TensorInfo:
    """A stored tensor's shape (torch order: ``[out, in]`` for a weight) and its file."""

    shape: tuple[int, ...]
    file: Path


def _product(a: int | None, b: int | None) -> int | None:
    return a * b if a is not None and b is not None else None


def check_config(config: Any, where: str) -> dict[str, int]:
    """Check a transformers config: ``architectures`` (when set) is a list of class names,
    and the sizes of :data:`SIZE_LIMITS` it states pass :func:`check_sizes`, whose result
    is returned. Raises :class:`ModelError` naming ``where``."""
    architectures = getattr(config, "architectures", None)
    if architectures is not None and not (isinstance(architectures, list) and all(
            isinstance(name, str) for name in architectures)):
        raise ModelError(f"{where}: config.architectures is {architectures!r}, not a list of "
                         "model class names")
    return check_sizes({name: value for name in SIZE_LIMITS
                        if (value := getattr(config, name, None)) is not None}, where)


def check_sizes(sizes: Mapping[str, Any], where: str) -> dict[str, int]:
    """Check ``sizes`` (config names -> values) and complete them for :func:`check_tensors`.

    Each must be an int in ``[1, SIZE_LIMITS[name]]`` (a list, as per-layer values, each
    element); the heads must divide into the KV heads, and without ``head_dim`` into the
    hidden size. Returns the sizes with ``num_key_value_heads`` (default: the heads) and
    ``head_dim`` (default: hidden size / heads) filled in. Raises :class:`ModelError`
    naming every bad size and ``where``.
    """
    problems = []
    checked: dict[str, int] = {}
    for name, value in sizes.items():
        values = value if isinstance(value, list | tuple) else [value]
        limit = SIZE_LIMITS[name]
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int)
               or not 1 <= v <= limit]
        if bad or not values:
            problems.append(f"{name}={value!r} (must be an integer from 1 to {limit})")
        elif not isinstance(value, list | tuple) or len(set(values)) == 1:
            checked[name] = values[0]
    if problems:
        raise ModelError(f"{where}: invalid config sizes: {'; '.join(problems)}")
    heads = checked.get("num_attention_heads")
    if heads is not None:
        kv_heads = checked.setdefault("num_key_value_heads", heads)
        if heads % kv_heads:
            problems.append(f"num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={kv_heads}")
        hidden = checked.get("hidden_size")
        if "head_dim" not in checked and hidden is not None:
            if hidden % heads:
                problems.append(f"hidden_size={hidden} is not a multiple of "
                                f"num_attention_heads={heads} (and no head_dim is given)")
            else:
                checked["head_dim"] = hidden // heads
    if problems:
        raise ModelError(f"{where}: inconsistent config sizes: {'; '.join(problems)}")
    return checked


def check_tensors(sizes: Sizes, tensors: Mapping[str, TensorInfo], where: str) -> None:
    """Check the tensors present against ``sizes`` (as :func:`check_sizes` returns them).

    Raises :class:`ModelError` for a tensor with a zero-sized dimension, layer indices other
    than ``0 .. num_hidden_layers - 1``, or a tensor whose shape disagrees with
    :data:`SHAPE_RULES`, naming the tensor and its file.
    """
    problems = [f"tensor {name} in {info.file} has a zero-sized dimension {info.shape}"
                for name, info in tensors.items() if 0 in info.shape]
    layers = {int(m.group(1)) for name in tensors if (m := LAYER_INDEX.search(name))}
    expected = sizes.get("num_hidden_layers")
    if expected is not None and layers and layers != set(range(expected)):
        beyond = sorted(i for i in layers if i >= expected)
        missing = sorted(set(range(expected)) - layers)
        problems.append(
            f"the config says num_hidden_layers={expected}, but the tensors are of "
            f"{len(layers)} layers (indices {min(layers)}..{max(layers)})"
            + (f"; layers {_span(beyond)} are beyond the config's count" if beyond else "")
            + (f"; layers {_span(missing)} have no tensors" if missing else ""))
    for name, info in tensors.items():
        rules = next((rules for suffix, rules in SHAPE_RULES.items()
                      if name == suffix or name.endswith(f".{suffix}")), ())
        for dim, what, size in rules:
            expected_size = size(_sizes_of(name, sizes))
            if expected_size is not None and len(info.shape) > dim and \
                    info.shape[dim] != expected_size:
                problems.append(f"tensor {name} in {info.file} has shape {info.shape}, but "
                                f"dim {dim} should be {what} = {expected_size}")
    if problems:
        raise ModelError(f"{where}: the tensors do not agree with the config: "
                         f"{'; '.join(problems[:5])}"
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))


def _sizes_of(name: str, sizes: Sizes) -> Sizes:
    """The sizes tensor ``name``'s rules read: an expert's projections (``.experts.``) are
    ``moe_intermediate_size`` wide where the config states it (its ``intermediate_size``
    is then the dense layers'). DeepSeek's shared experts (``.shared_experts.``) are
    ``n_shared_experts`` experts fused into one MLP, a width no checked size states: their
    width goes unchecked here (the model checks it when loading)."""
    if ".shared_experts." in name:
        return {k: v for k, v in sizes.items() if k != "intermediate_size"}
    if ".experts." in name and "moe_intermediate_size" in sizes:
        return {**sizes, "intermediate_size": sizes["moe_intermediate_size"]}
    return sizes


def _span(indices: list[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if len(indices) > 1 else str(indices[0])


def check_data_ranges(path: Path, reader: Any) -> None:
    """Check every tensor of GGUF ``path`` (read by ``reader``, a ``gguf.GGUFReader``) lies
    in the file's data section, starts at the file's alignment, and overlaps no other
    tensor: a corrupt tensor table (two tensors aliasing one offset) would otherwise load
    as a model that computes garbage. Raises :class:`ModelError` naming the tensor (both,
    for an overlap)."""
    alignment, end = int(reader.alignment), path.stat().st_size
    spans = sorted((int(t.data_offset), int(t.n_bytes), t.name) for t in reader.tensors)
    for start, size, name in spans:
        if start < reader.data_offset or start + size > end:
            raise ModelError(f"{path}: tensor {name}'s data ({size} bytes at {start}) lies "
                             f"outside the data section ({reader.data_offset}..{end})")
        if (start - reader.data_offset) % alignment:
            raise ModelError(f"{path}: tensor {name}'s data at {start} is not aligned to "
                             f"{alignment} bytes")
    for (start, size, name), (next_start, _, next_name) in zip(spans, spans[1:],
                                                               strict=False):
        if start + size > next_start:
            raise ModelError(f"{path}: tensors {name} and {next_name} overlap (bytes "
                             f"{next_start}..{start + size} belong to both)")
