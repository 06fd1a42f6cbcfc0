"""Rotary position embedding: one ``cos_sin_cache`` per model, applied by the
``rotary_embedding`` op bound from the model's kernel plan."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hwplug.errors import ModelError
from hwplug.kernel_registry.reference import build_cos_sin_cache
from hwplug.model_zoo.kernel_binding import bind

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

#: transformers' default RoPE base when a config names none.
DEFAULT_THETA = 10000.0


def _positive(name: str, value: Any, high: float) -> float:
    """``value`` of config field ``name`` as a float in ``(0, high]``, else a ModelError."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= high) or isinstance(value, bool):
        bound = "" if high == math.inf else f" and at most {high:g}"
        raise ModelError(f"config {name} must be a finite number above 0{bound}, got "
                         f"{value!r}")
    return number


def rope_parameters(hf_config: Any) -> tuple[float, dict[str, Any] | None, float]:
    """``(theta, rope_scaling, partial_rotary_factor)`` of a Hugging Face config.

    Reads transformers 5's ``rope_parameters`` dict, or 4.x's ``rope_theta`` /
    ``rope_scaling`` / ``partial_rotary_factor`` attributes. ``rope_scaling`` is None for
    plain RoPE, else the HF dict with its ``rope_type`` (as ``build_cos_sin_cache`` takes it).
    A theta that is not a finite number above 0, or a factor outside (0, 1], is a
    :class:`ModelError`.
    """
    params = dict(getattr(hf_config, "rope_parameters", None)
                  or getattr(hf_config, "rope_scaling", None) or {})
    theta = _positive("rope_theta", params.pop(
        "rope_theta", getattr(hf_config, "rope_theta", DEFAULT_THETA)), math.inf)
    partial = _positive("partial_rotary_factor", params.pop(
        "partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None) or 1.0), 1.0)
    rope_type = params.pop("type", params.get("rope_type", "default"))
    scaling = None if rope_type == "default" else {**params, "rope_type": rope_type}
    return theta, scaling, partial


class RotaryEmbedding(nn.Module):
    """Rotates the first ``rotary_dim`` dims of every query/key head by its position's angle.

    ``cos_sin_cache [max_position, rotary_dim]`` float32 is built once here and shared by
    every layer that holds this module. ``forward(positions [T] int64, query [T, Hq, D],
    key [T, Hkv, D]) -> (query, key)`` rotated, same shapes and dtype.
    """

    def __init__(self, rotary_dim: int, max_position: int, base: float,
                 rope_scaling: dict[str, Any] | None = None, is_neox: bool = True,
                 ctx: ModelContext | None = None) -> None:
        super().__init__()
        self.rotary_dim, self.is_neox = rotary_dim, is_neox
        self.rotary_embedding, _ = bind(ctx, "RotaryEmbedding", "rotary_embedding")
        # built on the CPU, then moved: under the meta device (a memory estimate) torch's
        # arange would import torch._dynamo, about 0.8 s of a cold start
        cache = build_cos_sin_cache(rotary_dim, max_position, base, rope_scaling)
        self.register_buffer("cos_sin_cache", cache.to(torch.get_default_device()),
                             persistent=False)

    @classmethod
    def from_config(cls, hf_config: Any, head_size: int, is_neox: bool = True,
                    ctx: ModelContext | None = None) -> RotaryEmbedding:
        """The RoPE a Hugging Face decoder config describes, for heads of ``head_size``: a
        row per position below ``ctx.max_model_len`` (the context's when None)."""
        theta, scaling, partial = rope_parameters(hf_config)
        positions = int(hf_config.max_position_embeddings)
        if scaling and scaling["rope_type"] == "yarn" and scaling.get("factor") is None:
            # transformers' reading: the context grown from the original one
            scaling["factor"] = positions / scaling["original_max_position_embeddings"]
        if ctx is not None and ctx.max_model_len is not None:
            positions = min(positions, ctx.max_model_len)
        return cls(int(head_size * partial), positions, theta, scaling, is_neox, ctx)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary_embedding(positions, query, key, self.cos_sin_cache, self.is_neox)
