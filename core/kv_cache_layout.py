"""``KVCacheLayout``: how one layer's paged KV cache keeps its entries, as an object.

A layout is registered by name (``hwplug.registries.kv_layouts``, filled by the
``hwplug_register_kv_layouts`` hook); an attention backend names its layout in
``kv_cache_layout``, the ``reshape_and_cache`` / ``paged_attention`` ops find it in their
:class:`~hwplug.attention.PagedAttentionParams` (``params.layout``) and dispatch on it, and
connectors read and write blocks through it. Core defines one layout, the reference
``NHD`` (:data:`NHD`): ``[2, num_blocks, block_size, num_kv_heads, head_size]``, keys then
values. Core also defines ``MLA`` (:data:`MLA`), the latent cache of multi-head latent
attention: ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``. Every other
layout belongs to the plugin whose kernels read it, and says how its
caches convert to and from ``NHD`` (the reference ops serve any layout that way, and
connectors convert blocks between the layouts of two engines through it).

Importing this module does not import torch.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from hwplug.errors import UnsupportedError
from hwplug.interface import StrictInterface

if TYPE_CHECKING:
    import torch

__all__ = ["ANY_LAYOUT", "MLA", "NHD", "REFERENCE_LAYOUT", "KVCacheLayout", "MLALayout",
           "NHDLayout", "checked_reference", "registered_layout"]

#: Name of the reference layout, the one core defines.
REFERENCE_LAYOUT = "NHD"
#: In a kernel variant's ``layouts``: every registered layout (the references' claim).
ANY_LAYOUT = "*"


class KVCacheLayout(StrictInterface, abc.ABC):
    """The contract of a KV-cache layout: one instance per layout, registered under
    :attr:`name` (see :mod:`hwplug.kv_cache_layout`).

    A cache of ``num_blocks`` blocks of ``block_size`` tokens holds, for every block, slot,
    KV head and head dimension, one key and one value. The layout says where:

    * :meth:`shape` is one layer's cache shape (``AttentionBackend.kv_cache_shape`` asks
      it); :meth:`check` says why a tensor is not a cache of this layout;
    * :meth:`to_reference` gives the same entries as an ``NHD`` cache ``[2, num_blocks,
      block_size, Hkv, D]``, :meth:`from_reference` writes an ``NHD`` cache's entries into a
      cache of this layout (exact permutations: every dtype, fp8 included, round-trips bit
      for bit). When :attr:`reference_is_view` is True, :meth:`to_reference` returns a view
      sharing the cache's memory (writes through it land in the cache);
    * :meth:`select_blocks`, :meth:`write_blocks` and :meth:`join_blocks` address whole
      blocks, for connectors: the blocks of a cache are again a cache of this layout.
      Their defaults index dimension :attr:`block_dim`; a layout whose blocks do not lie
      along one dimension overrides all three.

    Subclasses define :attr:`name`, :meth:`shape`, :meth:`check`, :meth:`to_reference` and
    :meth:`from_reference`; helpers of their own must be private (a leading underscore).
    """

    _interface_root = True

    #: The registered name (``"NHD"``, or a plugin's own), what backends state in
    #: ``kv_cache_layout`` and variants in ``layouts``.
    name: ClassVar[str]
    #: True when :meth:`to_reference` returns a view of the cache's own memory.
    reference_is_view: ClassVar[bool] = False
    #: The cache dimension that indexes blocks (used by the block-access defaults).
    block_dim: ClassVar[int] = 1
    #: False for a latent cache (``MLA``): one KV head, no values stored (they read as
    #: zero in ``NHD``), so it holds exactly the ``NHD`` caches of that form.
    holds_values: ClassVar[bool] = True

    @abc.abstractmethod
    def shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype | None = None) -> tuple[int, ...]:
        """One layer's cache shape. ``dtype`` is the cache dtype where known; a layout whose
        shape depends on it must say so when it is None (raise UnsupportedError)."""

    @abc.abstractmethod
    def check(self, cache: torch.Tensor) -> str | None:
        """Why ``cache`` is not a cache of this layout (shape, strides, dtype), or None."""

    @abc.abstractmethod
    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        """``cache``'s entries as an ``NHD`` cache ``[2, num_blocks, block_size, Hkv, D]``
        in the cache's dtype: a view when :attr:`reference_is_view`, else a new tensor."""

    @abc.abstractmethod
    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        """Write the ``NHD`` cache ``reference``'s entries into ``out``, a cache of this
        layout of the same geometry and dtype (the inverse of :meth:`to_reference`)."""

    def select_blocks(self, cache: torch.Tensor, ids: Sequence[int] | torch.Tensor
                      ) -> torch.Tensor:
        """A new cache of this layout holding ``cache``'s blocks ``ids``, in that order (a
        copy: it does not share ``cache``'s memory)."""
        return cache[self._block_index(cache, ids)]

    def write_blocks(self, cache: torch.Tensor, ids: Sequence[int] | torch.Tensor,
                     blocks: torch.Tensor) -> None:
        """Write ``blocks`` (a cache of this layout of ``len(ids)`` blocks, on any device)
        into ``cache``'s blocks ``ids``, in place; every other block is left untouched."""
        cache[self._block_index(cache, ids)] = blocks.to(cache.device)

    def join_blocks(self, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        """One cache of this layout holding every cache of ``blocks``' blocks, in order."""
        import torch

        return torch.cat(list(blocks), dim=self.block_dim)

    def _block_index(self, cache: torch.Tensor, ids: Sequence[int] | torch.Tensor
                     ) -> tuple[object, ...]:
        import torch

        index = torch.as_tensor(ids, dtype=torch.long, device=cache.device)
        return (slice(None),) * self.block_dim + (index,)

    def __repr__(self) -> str:
        return f"<KV-cache layout {self.name}>"


class NHDLayout(KVCacheLayout):
    """The reference layout: ``[2, num_blocks, block_size, num_kv_heads, head_size]``, keys
    (``cache[0]``) then values (``cache[1]``), each token's heads side by side. The pure-torch
    references compute over it."""

    name: ClassVar[str] = REFERENCE_LAYOUT
    reference_is_view: ClassVar[bool] = True
    block_dim: ClassVar[int] = 1

    def shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype | None = None) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    def check(self, cache: torch.Tensor) -> str | None:
        if cache.dim() != 5 or cache.shape[0] != 2:
            return f"an NHD cache is [2, num_blocks, block_size, Hkv, D], got " \
                   f"{tuple(cache.shape)}"
        return None

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        return cache

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        if reference is not out:
            out.copy_(reference)


#: The reference layout's one instance (registered in code as ``"NHD"``).
NHD = NHDLayout()


class MLALayout(KVCacheLayout):
    """The latent cache of multi-head latent attention (DeepSeek-V2/V3):
    ``[num_blocks, block_size, D]`` with ``D = kv_lora_rank + qk_rope_head_dim``, each
    token's normalised latent ``c_kv`` then its roped shared key ``k_pe`` (one "KV head":
    ``num_kv_heads`` must be 1). There are no separate values: MLA reads them from the
    latent. As ``NHD`` it is ``[2, num_blocks, block_size, 1, D]`` with the entries as keys
    and zero values, so a round trip through ``NHD`` is exact."""

    name: ClassVar[str] = "MLA"
    block_dim: ClassVar[int] = 0
    holds_values: ClassVar[bool] = False

    def shape(self, num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              dtype: torch.dtype | None = None) -> tuple[int, ...]:
        if num_kv_heads != 1:
            raise UnsupportedError(f"an MLA cache holds one latent head per token, got "
                                   f"num_kv_heads={num_kv_heads}")
        return (num_blocks, block_size, head_size)

    def check(self, cache: torch.Tensor) -> str | None:
        if cache.dim() != 3:
            return f"an MLA cache is [num_blocks, block_size, D], got {tuple(cache.shape)}"
        return None

    def to_reference(self, cache: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.stack((cache, torch.zeros_like(cache))).unsqueeze(-2)

    def from_reference(self, reference: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(reference[0, :, :, 0])


#: The MLA latent layout's one instance (registered in code as ``"MLA"``).
MLA = MLALayout()


def registered_layout(name: str) -> KVCacheLayout:
    """The layout registered as ``name`` (plugins' layouts included: the registry is
    filled by discovery before its first read); an unknown name raises
    :class:`~hwplug.errors.UnknownNameError` listing the registered ones."""
    from hwplug import registries

    return registries.kv_layouts.get(name)


def checked_reference(layout: KVCacheLayout, cache: torch.Tensor) -> torch.Tensor:
    """``layout.to_reference(cache)`` after ``layout.check(cache)``: raises
    :class:`~hwplug.errors.UnsupportedError` with the check's reason for a cache that is
    not in ``layout``."""
    problem = layout.check(cache)
    if problem:
        raise UnsupportedError(f"not a {layout.name} cache: {problem}")
    return layout.to_reference(cache)
