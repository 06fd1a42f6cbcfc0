"""``TORCH_PAGED``: the paged attention backend built from the registry's ops.

It runs on every platform: its two ops, ``reshape_and_cache`` and ``paged_attention``,
dispatch to the platform's best variants (the pure-torch references where nothing
better is registered), so it serves every mask the ``paged_attention`` op defines. It is
the oracle the conformance kit compares other backends against, and a base for
backends that only add facts about which variants must serve them (hwplug-triton's
``TRITON_ATTN`` family). KV layout ``NHD``: one layer's cache is ``[2, num_blocks,
block_size, Hkv, D]``. A backend of another registered layout only names it
(``kv_cache_layout``): the layer's params carry the layout, so the two ops choose the
variants that serve it (the references serve any), and ``kv_cache_shape`` asks it. The
layer's :class:`~hwplug.attention.PagedAttentionParams` are built once, on the first
call (the model layer sets ``k_scale`` / ``v_scale`` after building the backend, and
``forward`` brings the scale), and reused by every later call.
Registered also under its old name ``REFERENCE``, a deprecated alias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import (
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    KernelBinder,
    PagedAttentionParams,
)
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES
from hwplug.kernel_registry import registry
from hwplug.kv_cache_layout import registered_layout

if TYPE_CHECKING:
    import torch


class TorchPagedBackend(AttentionBackend):
    """Writes K/V with ``reshape_and_cache``, then attends with ``paged_attention``: both
    bound from the model's kernel plan when the backend is made (for its dtype and
    layout)."""

    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    #: fp8 caches are read with this layer's k/v scales (``k_scale`` / ``v_scale``).
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *FP8_KV_DTYPES)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256)
    supports_non_causal: ClassVar[bool] = True
    supports_sliding_window: ClassVar[bool] = True
    supports_soft_cap: ClassVar[bool] = True
    kv_cache_layout: ClassVar[str] = "NHD"
    updates_kv_cache_in_forward: ClassVar[bool] = True

    def __init__(self, spec: AttentionSpec, kernels: KernelBinder | None = None) -> None:
        super().__init__(spec, kernels)
        plan = kernels if kernels is not None else registry.kernels.default_plan()
        self._write, self._attend = (plan.bind(op, spec.dtype, self.kv_cache_layout)
                                     for op in ("reshape_and_cache", "paged_attention"))
        self._layout = registered_layout(self.kv_cache_layout)
        self._params: PagedAttentionParams | None = None

    @classmethod
    def get_name(cls) -> str:
        return "TORCH_PAGED"

    def _layer_params(self, scale: float | None) -> PagedAttentionParams:
        """This layer's :class:`PagedAttentionParams`, built on first use and again only
        when ``scale`` (None: any) or the k/v scales the model layer set have changed."""
        params = self._params
        if (params is None or (scale is not None and params.scale != scale)
                or params.k_scale is not self.k_scale or params.v_scale is not self.v_scale):
            spec = self.spec
            params = self._params = PagedAttentionParams(
                spec.head_size ** -0.5 if scale is None else scale, spec.causal,
                spec.sliding_window, spec.soft_cap, self.k_scale, self.v_scale, self._layout)
        return params

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> None:
        self._write(key, value, kv_cache, metadata.slot_mapping, self._layer_params(None))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        params = self._layer_params(scale)
        self._write(key, value, kv_cache, metadata.slot_mapping, params)
        return self._attend(query, kv_cache, metadata, params)
