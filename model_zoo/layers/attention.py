"""``Attention``: one model layer's paged attention, served by the context's backend."""

from __future__ import annotations

import inspect
import logging
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING

import torch
from torch import nn

from hwplug.attention import AttentionBackend, AttentionMetadata, AttentionSpec, KernelBinder
from hwplug.dtypes import is_quantized_kv_cache, torch_dtype
from hwplug.errors import ModelError

if TYPE_CHECKING:
    from hwplug.model_zoo.context import ModelContext

logger = logging.getLogger(__name__)

#: Checkpoint names of a layer's KV-cache scales, relative to its attention block
#: (``model.layers.0.self_attn.``), as producers write them.
KV_SCALE_NAMES = {name: f"attn.{half}_scale" for half in ("k", "v") for name in (
    f"{half}_scale", f"{half}_proj.{half}_scale", f"{half}_proj.output_scale")}


def kv_scale_target(name: str, block: str = "self_attn") -> tuple[str, None] | None:
    """The parameter a checkpoint's KV-cache scale ``name`` loads into
    (``model.layers.0.self_attn.k_proj.output_scale`` ->
    ``model.layers.0.self_attn.attn.k_scale``), or None when ``name`` is no KV scale."""
    head, sep, tail = name.partition(f".{block}.")
    if sep and tail in KV_SCALE_NAMES:
        return f"{head}.{block}.{KV_SCALE_NAMES[tail]}", None
    return None


def make_backend(cls: type[AttentionBackend], spec: AttentionSpec,
                 kernels: KernelBinder) -> AttentionBackend:
    """A ``cls`` backend for ``spec`` that binds its ops from ``kernels``. A backend class
    written before backends took ``kernels`` (``__init__(self, spec)``) is still made, with
    a deprecation warning: it calls the ops through the process's default plan."""
    parameters = inspect.signature(cls).parameters
    if "kernels" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return cls(spec, kernels=kernels)
    warnings.warn(f"{cls.__name__}.__init__ takes no kernels: its ops are not bound from the "
                  "model's plan; accept __init__(self, spec, kernels=None) and pass kernels "
                  "to super().__init__", DeprecationWarning, stacklevel=3)
    return cls(spec)


class Attention(nn.Module):
    """Attention of ``num_heads`` query heads over ``num_kv_heads`` cached K/V heads.

    The backend instance (``ctx.attention_backend``) is built once, for a spec taken from
    ``ctx.engine_config`` (dtype, KV-cache dtype, block size, causal, soft cap) with this
    layer's geometry and ``sliding_window``. ``forward(query, key, value, kv_cache,
    metadata)`` takes ``query [T, Hq * D]`` (or ``[T, Hq, D]``), ``key``/``value [T, Hkv *
    D]`` (or ``[T, Hkv, D]``), this layer's ``kv_cache`` and the batch's metadata, and
    returns ``[T, Hq * D]``. The new K/V are stored by the backend's forward when it
    ``updates_kv_cache_in_forward``, else by ``backend.write_kv_cache`` just before it.

    A quantized (fp8) KV cache gets the parameters ``k_scale`` and ``v_scale`` (float32
    ``[Hkv]``; a per-tensor scale is the same value for every head), handed to the backend:
    loaded from the checkpoint when it has them (see :data:`KV_SCALE_NAMES`; finite and > 0,
    else a :class:`ModelError`), else 1.0, or, with ``calculate_kv_scales``, computed from
    the first batch whose K/V are not all zero as ``amax / fp8 max`` per tensor or per KV
    head, at least ``1 / fp8 max`` (a head that was all zero then holds values up to 1).
    """

    #: Parameters a checkpoint may leave out (they keep their initial value).
    optional_parameters = ("k_scale", "v_scale")

    def __init__(self, ctx: ModelContext, num_heads: int, num_kv_heads: int, head_size: int,
                 *, scale: float | None = None, sliding_window: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.scale = head_size ** -0.5 if scale is None else scale
        config = ctx.engine_config
        spec = replace(AttentionSpec.from_config(config), num_heads=num_heads,
                       num_kv_heads=num_kv_heads, head_size=head_size,
                       sliding_window=sliding_window)
        self.backend = make_backend(ctx.attention_backend, spec, ctx.kernels)
        self.writes_cache_first = not self.backend.updates_kv_cache_in_forward
        self._scales_pending: str | None = None
        if is_quantized_kv_cache(config.kv_cache_dtype):
            self.k_scale, self.v_scale = (
                nn.Parameter(torch.ones(num_kv_heads, dtype=torch.float32), requires_grad=False) for _ in range(2))
            self.backend.k_scale, self.backend.v_scale = self.k_scale, self.v_scale
            self._fp8_max = torch.finfo(torch_dtype(config.kv_cache_dtype)).max
            if config.calculate_kv_scales:
                self._scales_pending = config.kv_scale_granularity

    def load_weight(self, param_name: str, tensor: torch.Tensor, shard: str | None) -> None:
        """Load a checkpoint KV scale: one value (per tensor) or one per KV head."""
        if tensor.numel() not in (1, self.num_kv_heads):
            raise ModelError(f"{param_name} has {tensor.numel()} values; expected 1 (per "
                             f"tensor) or {self.num_kv_heads} (per KV head)")
        with torch.no_grad():
            getattr(self, param_name).copy_(tensor.float().reshape(-1).expand(self.num_kv_heads))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata) -> torch.Tensor:
        query = query.view(-1, self.num_heads, self.head_size)
        key = key.view(-1, self.num_kv_heads, self.head_size)
        value = value.view(-1, self.num_kv_heads, self.head_size)
        if self._scales_pending and bool(key.any() or value.any()):  # all zero: no range yet
            self._calculate_scales(key, value, self._scales_pending)
            self._scales_pending = None
        if self.writes_cache_first:
            self.backend.write_kv_cache(key, value, kv_cache, metadata)
        out = self.backend.forward(query, key, value, kv_cache, metadata, self.scale)
        return out.reshape(-1, self.num_heads * self.head_size)

    def _calculate_scales(self, key: torch.Tensor, value: torch.Tensor, granularity: str
                          ) -> None:
        for param, x in ((self.k_scale, key), (self.v_scale, value)):
            amax = x.detach().float().abs().amax(dim=(0, 2))  # [Hkv]
            if granularity == "tensor":
                amax = amax.amax().expand_as(amax)
            param.copy_((amax / self._fp8_max).clamp(min=1 / self._fp8_max))
        logger.debug("calculated %s KV scales: k %s, v %s", granularity, self.k_scale.tolist(),
                     self.v_scale.tolist())
