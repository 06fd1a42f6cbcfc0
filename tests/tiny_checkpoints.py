"""Small real checkpoints written by tests: a Hugging Face Llama directory and GGUF edits.

:func:`write_tiny_llama` saves a 2-layer Llama (random weights, a 64-token word-level
tokenizer) with transformers' own ``save_pretrained``, so it is a directory exactly as a
user would have one. :func:`gguf_with_field` copies a GGUF file with one integer metadata
value changed in place, as a corrupt or hand-edited file would have it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from safetensors.torch import load_file, save_file

#: The tiny Llama's config (transformers ``LlamaConfig`` keywords).
TINY_LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=True, eos_token_id=1, bos_token_id=0)
WEIGHTS = "model.safetensors"


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2,
             **{f"w{i}": i for i in range(3, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")


def write_tiny_llama(directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save the tiny Llama (config :data:`TINY_LLAMA` updated by ``overrides``) into
    ``directory``; returns it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY_LLAMA, **overrides})
    LlamaForCausalLM(config).save_pretrained(directory)
    _tokenizer(config.vocab_size).save_pretrained(directory)
    return directory


def edit_config(directory: Path, **changes: Any) -> None:
    """Change ``config.json`` values in place (the weights stay as they are)."""
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_tensors(directory: Path, **tensors: torch.Tensor | None) -> None:
    """Replace (or with None, drop) tensors of ``model.safetensors``; a name's dots are
    written as ``__`` in the keyword (``model__norm__weight``)."""
    path = directory / WEIGHTS
    state = load_file(path)
    for key, tensor in tensors.items():
        name = key.replace("__", ".")
        if tensor is None:
            del state[name]
        else:
            state[name] = tensor
    save_file(state, path, metadata={"format": "pt"})


def gguf_with_field(source: Path, target: Path, key: str, value: int) -> Path:
    """Copy GGUF ``source`` to ``target`` with integer metadata ``key`` set to ``value``
    (in the field's own integer type, so the file stays well-formed)."""
    field = GGUFReader(source).fields[key]
    stored = field.parts[-1]
    offset = field.offset + sum(part.nbytes for part in field.parts[:-1])
    shutil.copyfile(source, target)
    with open(target, "r+b") as file:
        file.seek(offset)
        file.write(np.array([value], dtype=stored.dtype).tobytes())
    return target


def _requantized(data: np.ndarray, kind: int, new_kind: Any) -> np.ndarray:
    """GGUF rows ``data`` of type ``kind`` stored as ``new_kind`` (see :func:`shrink_gguf`)."""
    from gguf import quants

    values = quants.dequantize(data, kind)
    try:
        return quants.quantize(values, new_kind)
    except NotImplementedError:  # gguf cannot quantize K-quants
        from hwplug.kernel_registry.reference.ggml_weights import ggml_weight

        rows = ggml_weight(torch.Generator().manual_seed(0), int(new_kind), *values.shape)
        return rows.numpy()


def shrink_gguf(source: Path, target: Path, layers: int = 2, vocab: int = 256,
                retype: dict[str, int] | None = None) -> Path:
    """Write ``target``: GGUF ``source`` cut to its first ``layers`` layers and ``vocab``
    tokens (the embedding's first rows, the merges among those tokens), every other
    metadata value and tensor byte as it was. A file small enough to fuzz, with the real
    one's structure.

    ``retype`` stores the layers' tensors of a kind (``"attn_v"``) in another GGUF type:
    requantized by ``gguf.quants`` where it can (Q4_0 .. Q8_0, F16, BF16), else (K-quants)
    random blocks of that type.
    """
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    kept = set(tokens)
    merges = [m for m in reader.fields["tokenizer.ggml.merges"].contents()
              if set(m.split(" ")) <= kept and m.replace(" ", "") in kept]
    edits = {f"{arch}.block_count": layers, f"{arch}.vocab_size": vocab,
             "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
             "tokenizer.ggml.token_type":
                 reader.fields["tokenizer.ggml.token_type"].contents()[:vocab]}
    writer = GGUFWriter(target, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        array = field.types[0] == GGUFValueType.ARRAY
        writer.add_key_value(key, edits.get(key, field.contents()), field.types[0],
                             field.types[-1] if array else None)
    for tensor in reader.tensors:
        index = tensor.name.split(".")[1] if tensor.name.startswith("blk.") else None
        if index is not None and int(index) >= layers:
            continue
        data = tensor.data[:vocab] if tensor.name == "token_embd.weight" else tensor.data
        kind = (retype or {}).get(tensor.name.split(".")[-2], tensor.tensor_type)
        if kind != tensor.tensor_type:
            data = _requantized(data, tensor.tensor_type, GGMLQuantizationType(kind))
        quantized = kind not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
        writer.add_tensor(tensor.name, np.ascontiguousarray(data),
                          raw_dtype=GGMLQuantizationType(kind) if quantized else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
