"""``TORCH_MLA``: the multi-head latent attention backend built from the registry's ops.

It runs on every platform (after a platform's own backends, see
:meth:`hwplug.Platform.attention_backends`): ``concat_and_cache_mla`` stores each step's
latents in the ``MLA`` cache (``[num_blocks, block_size, kv_lora_rank +
qk_rope_head_dim]``) and ``mla_attention`` attends over it, both bound from the model's
kernel plan (the pure-torch references where nothing better is registered: the expanded
form for prefill and mixed batches, the absorbed form for decode).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from hwplug.attention import AttentionMetadata, AttentionSpec, KernelBinder
from hwplug.attention_mla import MLAAttentionBackend
from hwplug.dtypes import FLOAT_DTYPES, FP8_KV_DTYPES
from hwplug.kernel_registry import registry

if TYPE_CHECKING:
    import torch


class TorchMLABackend(MLAAttentionBackend):
    """Writes the latents with ``concat_and_cache_mla``, then attends with
    ``mla_attention``; an fp8 cache is read with the layer's ``kv_scale``."""

    supported_dtypes: ClassVar[tuple[str, ...]] = FLOAT_DTYPES
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = (*FLOAT_DTYPES, *FP8_KV_DTYPES)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 8, 16, 32, 64, 128, 256)

    def __init__(self, spec: AttentionSpec, kernels: KernelBinder | None = None) -> None:
        super().__init__(spec, kernels)
        plan = kernels if kernels is not None else registry.kernels.default_plan()
        self._write, self._attend = (plan.bind(op, spec.dtype)
                                     for op in ("concat_and_cache_mla", "mla_attention"))

    @classmethod
    def get_name(cls) -> str:
        return "TORCH_MLA"

    def forward_mla(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor,
                    k_pe: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                    w_uk: torch.Tensor, w_uv: torch.Tensor, scale: float) -> torch.Tensor:
        self._write(kv_c, k_pe, kv_cache, metadata.slot_mapping, self.kv_scale)
        return self._attend(q_nope, q_pe, kv_cache, metadata, w_uk, w_uv, scale,
                            self.kv_scale)
