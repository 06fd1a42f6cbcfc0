"""Rotary position embedding (RoPE) and the cos/sin cache it reads."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hwplug.errors import ConfigError, UnsupportedError

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``query [T, Hq, D]`` and ``key [T, Hk, D]`` by the angles of ``positions [T]``.

    ``cos_sin_cache [max_pos, rot_dim]`` holds cos in its first ``rot_dim / 2`` columns and
    sin in the rest (see :func:`build_cos_sin_cache`). Only the first ``rot_dim`` dims of
    each head rotate; the rest pass through. Pairs are ``(i, i + rot_dim/2)`` when
    ``is_neox`` and ``(2i, 2i + 1)`` otherwise (GPT-J). fp32 inside; outputs keep the
    input dtypes.
    """
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # broadcast over heads
    return _rotate(query, cos, sin, is_neox), _rotate(key, cos, sin, is_neox)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    rot_dim = 2 * cos.shape[-1]
    rotated = x[..., :rot_dim].float()
    if is_neox:
        x1, x2 = rotated.chunk(2, dim=-1)
    else:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    out1, out2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if is_neox:
        rotated = torch.cat((out1, out2), dim=-1)
    else:
        rotated = torch.stack((out1, out2), dim=-1).flatten(-2)
    return torch.cat((rotated.to(x.dtype), x[..., rot_dim:]), dim=-1)


def build_cos_sin_cache(
    rot_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None = None,
) -> torch.Tensor:
    """The ``[max_position, rot_dim]`` fp32 cache ``cat(cos(p * f), sin(p * f))`` for
    :func:`rotary_embedding`, with inverse frequencies ``f`` as in Hugging Face transformers.

    ``rope_scaling`` is a transformers-style dict: None or ``{"rope_type": "default"}``,
    ``{"rope_type": "linear", "factor"}`` or ``{"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}`` or
    ``{"rope_type": "yarn", "factor", "original_max_position_embeddings"}`` with optional
    ``beta_fast`` (32), ``beta_slow`` (1), ``truncate`` (True) and ``attention_factor``
    (else from ``mscale`` and ``mscale_all_dim``; it scales cos and sin) (the legacy key
    ``"type"`` is read too). Computed on the CPU whatever the default device (the
    caller moves it). Raises :class:`~hwplug.errors.ConfigError` for an odd ``rot_dim`` and
    :class:`~hwplug.errors.UnsupportedError` for another rope type.
    """
    if rot_dim <= 0 or rot_dim % 2:
        raise ConfigError(f"rot_dim must be a positive even number, got {rot_dim}")
    scaling = dict(rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device="cpu")
                               / rot_dim))
    attention_factor = 1.0
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling)
    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn_inv_freq(inv_freq, rot_dim, base, scaling)
    elif rope_type != "default":
        raise UnsupportedError(
            f"rope type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    angles = torch.arange(max_position, dtype=torch.float32, device="cpu")[:, None] * inv_freq
    return torch.cat((angles.cos() * attention_factor, angles.sin() * attention_factor), dim=-1)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(factor) + 1`` (1 for ``factor <=
    1``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(inv_freq: torch.Tensor, rot_dim: int, base: float,
                   scaling: Mapping[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071): dimensions that turn fewer than ``beta_slow`` times over
    the original context are interpolated by ``factor``, those that turn more than
    ``beta_fast`` times keep their frequency, a linear ramp between; and the attention
    factor cos and sin are scaled by."""
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
                            if mscale and mscale_all_dim else yarn_mscale(factor))

    def dimension(rotations: float) -> float:  # the dimension turning `rotations` times
        return rot_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension(scaling.get("beta_fast") or 32), dimension(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rot_dim - 1)
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float32, device="cpu") - low)
            / ((high - low) if high != low else 0.001)).clamp(0, 1)
    return inv_freq / factor * ramp + inv_freq * (1 - ramp), float(attention_factor)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slow down by ``factor``, short ones stay, and the
    band between is interpolated smoothly."""
    factor = scaling["factor"]
    low_freq_factor, high_freq_factor = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)
