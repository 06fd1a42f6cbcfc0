"""``MLAAttentionBackend``: multi-head latent attention (DeepSeek-V2/V3) over a latent cache.

An MLA layer caches, per token, one latent "head" of ``D = kv_lora_rank + qk_rope_head_dim``:
its normalised compressed latent ``c_kv [L]`` and its roped shared key ``k_pe [R]`` (layout
``MLA``, ``[num_blocks, block_size, D]``), instead of ``2 * Hkv * head_size`` values of
full keys and values. Keys and values are recovered from the latent with the layer's
up-projections ``W_UK [H, N, L]`` and ``W_UV [H, V, L]`` (``kv_b_proj`` split per head):
``k_nope = W_UK c_kv``, ``v = W_UV c_kv``. A backend computes prefill in the expanded form
(keys and values of the context expanded, then attention) and decode in the absorbed form
(``W_UK`` folded into the query, attention against the latent cache as one shared KV
head, ``W_UV`` applied after), as vLLM's MLA backends do; both are the same function
(see the ``mla_attention`` op in :mod:`hwplug.kernel_registry.ops_mla`).

The spec of an MLA layer says ``is_mla`` (``num_kv_heads`` 1, ``head_size`` ``D``); only a
backend whose ``is_mla`` is True accepts it. The layer calls :meth:`forward_mla`, which
writes the step's latents into the cache and returns the attention output per head.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionBackend, AttentionMetadata, AttentionSpec, KernelBinder
from hwplug.errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["MLAAttentionBackend"]


class MLAAttentionBackend(AttentionBackend):
    """Latent attention for one MLA :class:`~hwplug.attention.AttentionSpec` (``is_mla``).

    ``kv_scale`` (float32 ``[]``) is the layer's cache scale for a quantized (fp8) cache,
    set by the model layer that owns the backend (None otherwise): stored = ``x /
    kv_scale`` in the cache dtype, read as ``stored.float() * kv_scale``.
    """

    _interface_root = True

    is_mla: ClassVar[bool] = True
    kv_cache_layout: ClassVar[str] = "MLA"
    updates_kv_cache_in_forward: ClassVar[bool] = True

    def __init__(self, spec: AttentionSpec, kernels: KernelBinder | None = None) -> None:
        super().__init__(spec, kernels)
        self.kv_scale: torch.Tensor | None = None

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        """Not an MLA backend's entry point: raises :class:`UnsupportedError` naming
        :meth:`forward_mla`."""
        raise UnsupportedError(f"{self.get_name()} is an MLA backend: call forward_mla "
                               "with the latents and the layer's W_UK / W_UV")

    @abc.abstractmethod
    def forward_mla(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                    k_pe: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
        """Store this step's latents, then attend; returns ``[T, H, V]`` in ``q_nope``'s
        dtype.

        ``q_nope [T, H, N]`` and ``q_pe [T, H, R]`` (roped) are the queries;
        ``kv_c [T, L]`` (normalised) and ``k_pe [T, R]`` (roped) the step's latents,
        stored at ``metadata.slot_mapping`` as ``[kv_c, k_pe]``; ``w_uk [H, N, L]`` and
        ``w_uv [H, V, L]`` the layer's up-projections; ``scale`` multiplies ``q.k`` (the
        model's ``(N + R) ** -0.5``). Causal over the cached context.
        """
