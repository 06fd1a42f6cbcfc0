"""``MLAAttention``: one model layer's multi-head latent attention over the latent cache."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.attention import AttentionMetadata, AttentionSpec
from hwplug.attention_mla import MLAAttentionBackend
from hwplug.dtypes import is_quantized_kv_cache, torch_dtype
from hwplug.errors import ModelError
from hwplug.model_zoo.layers.attention import make_backend

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

logger = logging.getLogger(__name__)


class MLAAttention(nn.Module):
    """Latent attention of ``num_heads`` heads over a cache of ``kv_lora_rank +
    qk_rope_head_dim`` per token (see :mod:`hwplug.attention_mla`).

    The backend (``ctx.attention_backend``, an MLA backend: the model's engine config says
    ``is_mla``) is built once for this geometry. ``forward(q_nope [T, H, N], q_pe [T, H, R],
    kv_c [T, L], k_pe [T, R], kv_cache, metadata, w_uk [H, N, L], w_uv [H, V, L])`` stores
    the step's latents and returns ``[T, H * V]``; ``scale`` multiplies ``q.k`` (DeepSeek:
    ``(N + R) ** -0.5``).

    A quantized (fp8) cache gets the parameter ``kv_scale`` (float32 ``[]``, one per
    layer): 1.0, or with ``calculate_kv_scales`` the first batch with a non-zero latent's
    ``amax / fp8 max`` (at least ``1 / fp8 max``).
    """

    #: Parameters a checkpoint may leave out (they keep their initial value).
    optional_parameters = ("kv_scale",)

    def __init__(self, ctx: ModelContext, num_heads: int, kv_lora_rank: int,
                 qk_rope_head_dim: int, *, scale: float) -> None:
        super().__init__()
        self.num_heads, self.scale = num_heads, scale
        config = ctx.engine_config
        spec = replace(AttentionSpec.from_config(config), num_heads=num_heads, num_kv_heads=1,
                       head_size=kv_lora_rank + qk_rope_head_dim, is_mla=True)
        self.backend = make_backend(ctx.attention_backend, spec, ctx.kernels)
        if not isinstance(self.backend, MLAAttentionBackend):
            raise ModelError(f"attention backend {self.backend.get_name()} is not an MLA "
                             "backend (is_mla); latent attention needs one")
        self._scale_pending = False
        if is_quantized_kv_cache(config.kv_cache_dtype):
            self.kv_scale = nn.Parameter(torch.ones((), dtype=torch.float32),
                                         requires_grad=False)
            self.backend.kv_scale = self.kv_scale
            self._fp8_max = torch.finfo(torch_dtype(config.kv_cache_dtype)).max
            self._scale_pending = config.calculate_kv_scales

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                k_pe: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                w_uk: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
        if self._scale_pending and bool(kv_c.any() or k_pe.any()):  # all zero: no range yet
            amax = torch.maximum(kv_c.detach().float().abs().amax(),
                                 k_pe.detach().float().abs().amax())
            self.kv_scale.copy_((amax / self._fp8_max).clamp(min=1 / self._fp8_max))
            self._scale_pending = False
            logger.debug("calculated the MLA cache scale %s", float(self.kv_scale))
        out = self.backend.forward_mla(q_nope, q_pe, kv_c, k_pe, kv_cache, metadata, w_uk,
                                       w_uv, self.scale)
        return out.reshape(out.shape[0], -1)
