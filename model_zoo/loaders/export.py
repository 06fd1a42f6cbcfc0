"""A loadable model written out as a Hugging Face directory of float safetensors.

:func:`export_hf` is what ``hwplug convert`` runs: a GGUF (dequantised) or a float Hugging
Face directory becomes ``config.json``, the generation config, the tokenizer's files and
``model-NNNNN-of-NNNNN.safetensors`` shards (with their index) in float32 or bfloat16,
named as transformers names the architecture's parameters, which transformers, vLLM and
any converter read. Tensors are read and written one shard at a time, so an 8B model
never needs its float weights in memory at once.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from hwplug.dtypes import torch_dtype
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.model_zoo.loaders.load import load_checkpoint
from hwplug.model_zoo.loaders.resolve import checkpoint_format, resolve_model

logger = logging.getLogger(__name__)

#: The float dtypes a model is written in.
EXPORT_DTYPES = ("float32", "bfloat16")
#: Bytes per safetensors shard (transformers' default is 5 GB; smaller shards keep the
#: memory of one shard small).
SHARD_BYTES = 2 * 2**30


def export_hf(model: str | os.PathLike[str] | None, out: str | os.PathLike[str],
              dtype: str = "float32", shard_bytes: int = SHARD_BYTES) -> Path:
    """Write ``model`` (anything :func:`load_checkpoint` loads) to the new or empty
    directory ``out`` in ``dtype``; returns ``out``. Raises :class:`ConfigError` for
    another dtype or an ``out`` that holds files, :class:`UnsupportedError` for a
    quantized Hugging Face checkpoint (its weights are not float)."""
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one hwplug convert writes; choose one of: "
                          f"{', '.join(EXPORT_DTYPES)}")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ConfigError(f"{target} exists and is not an empty directory: choose a new one")
    path = resolve_model(model)
    gguf = checkpoint_format(path) == "gguf"
    checkpoint = load_checkpoint(path, dequantize=gguf)
    config = checkpoint.transformers_config()
    method = (getattr(config, "quantization_config", None) or {}).get("quant_method")
    if method is not None:
        raise UnsupportedError(f"{path} is quantized ({method}): hwplug convert writes float "
                               f"weights of GGUF files and float checkpoints only")
    target.mkdir(parents=True, exist_ok=True)
    shards = _write_shards(checkpoint.weights(), target, torch_dtype(dtype), shard_bytes)
    config.torch_dtype = dtype
    config.save_pretrained(target)
    if checkpoint.generation_config is not None:
        checkpoint.generation_config.save_pretrained(target)
    checkpoint.tokenizer.save_pretrained(target)
    logger.info("wrote %s as %s safetensors (%d shards) to %s", path, dtype, shards, target)
    return target


def _write_shards(weights: Iterable[tuple[str, torch.Tensor]], target: Path,
                  dtype: torch.dtype, shard_bytes: int) -> int:
    """Write ``(name, tensor)`` pairs in ``dtype`` to shards of at most ``shard_bytes``
    (a larger tensor alone) and ``model.safetensors.index.json``; returns the shard count."""
    shard: dict[str, torch.Tensor] = {}
    shard_size = total = 0
    names: list[list[str]] = []  # each written shard's tensor names
    temporary: list[Path] = []
    for name, tensor in weights:
        value = tensor.to(dtype).contiguous()
        size = value.numel() * value.element_size()
        if shard and shard_size + size > shard_bytes:
            temporary.append(_flush(shard, target, len(temporary)))
            names.append(list(shard))
            shard, shard_size = {}, 0
        shard[name] = value
        shard_size += size
        total += size
    temporary.append(_flush(shard, target, len(temporary)))
    names.append(list(shard))
    count, weight_map = len(temporary), {}
    for index, (part, shard_names) in enumerate(zip(temporary, names, strict=True)):
        final = target / f"model-{index + 1:05d}-of-{count:05d}.safetensors"
        part.rename(final)
        weight_map.update(dict.fromkeys(shard_names, final.name))
    (target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return count


def _flush(tensors: dict[str, torch.Tensor], target: Path, index: int) -> Path:
    """Save one shard under a temporary name (renamed once the shard count is known)."""
    part = target / f".shard-{index:05d}.safetensors"
    save_file(tensors, part, metadata={"format": "pt"})
    return part
