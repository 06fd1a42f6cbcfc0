"""``AttentionBackend``: paged attention over a KV cache, with its eligibility as data.

A backend states what it can serve as class attributes (platforms, dtypes, KV dtypes,
head sizes, block sizes, masks, capability range, layout), so
:func:`hwplug.attention_selection.select_backend` can explain every accept and reject.
``validate(spec)`` turns those facts into reasons; a backend only overrides it to add
checks the attributes cannot express. Its computation goes through the kernel registry's
ops (``hwplug.ops``), so kernel policy and the "kernels used" report reach attention too.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from hwplug import registries
from hwplug.errors import UnsupportedError
from hwplug.interface import StrictInterface
from hwplug.kv_cache_layout import NHD, KVCacheLayout, registered_layout
from hwplug.requirements import Requirements

if TYPE_CHECKING:
    import torch

    from hwplug.config import EngineConfig
    from hwplug.platform_interface import Platform

__all__ = ["AttentionBackend", "AttentionMetadata", "AttentionSpec", "InternalFallback",
           "KernelBinder", "NHD", "PagedAttentionParams"]


class KernelBinder(Protocol):
    """What binds ops for a backend or layer: a model's
    :class:`~hwplug.kernel_registry.KernelPlan`. ``bind`` returns ``op`` bound for
    dispatch tensors of ``dtype`` (and caches of ``layout``), called like the op."""

    def bind(self, op: str, dtype: str, layout: str | None = None) -> Callable[..., Any]: ...


@dataclass(frozen=True)
class AttentionSpec:
    """The attention a model layer needs. ``block_size=None`` means "not settled yet"."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: str = "float32"
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    causal: bool = True
    sliding_window: int | None = None
    soft_cap: float | None = None
    #: Multi-head latent attention: one cached latent "head" of ``head_size`` =
    #: ``kv_lora_rank + qk_rope_head_dim`` per token (``num_kv_heads`` 1), served only by
    #: a backend whose ``is_mla`` is True (see :mod:`hwplug.attention_mla`).
    is_mla: bool = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> AttentionSpec:
        return cls(config.num_heads, config.num_kv_heads, config.head_size, config.dtype,
                   config.kv_cache_dtype, config.block_size, config.causal,
                   config.sliding_window, config.soft_cap, config.is_mla)


@dataclass
class AttentionMetadata:
    """Where one step's tokens sit in the paged KV cache, shared by every layer (see the
    ``paged_attention`` op).

    ``slot_mapping [T]`` int64: the cache slot of token t (negative = padding, not
    written); sequence i's queries are ``query[query_start_loc[i]:query_start_loc[i+1]]``
    (``query_start_loc [B+1]`` int32), the last tokens of its context of ``seq_lens[i]``
    tokens (``seq_lens [B]`` int32) stored in blocks ``block_tables[i]`` (``[B,
    max_blocks]`` int32; entries past a sequence's last block may be any block id or
    negative). ``max_query_len`` / ``max_seq_len`` are the host-side maxima of the query
    lengths and of ``seq_lens``, so no kernel needs to read them from the device.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int
    max_seq_len: int
    _rows: AttentionMetadata | None = field(default=None, init=False, repr=False,
                                            compare=False)

    def decode_rows(self, num_tokens: int) -> AttentionMetadata:
        """This step's ``num_tokens`` queries as one decode row each, for causal attention.

        Row ``t`` (query ``j`` of sequence ``i``, which has ``q_i`` queries) is a sequence
        of its own: context ``seq_lens[i] - q_i + j + 1`` tokens (up to and including its
        own position) in sequence ``i``'s blocks. Under a causal mask (with or without a
        sliding window) each query sees exactly the keys of its row, so a kernel that
        serves decode-only batches serves any causal batch through it: a speculative
        verify step (``k + 1`` queries per sequence on an existing context) or a short
        prefill chunk. Returns ``self`` for a decode-only batch; otherwise computed on the
        device without a host sync, once per metadata (every layer of a step shares it).
        The rows' ``slot_mapping`` is this step's. Read-only: mutating this metadata's
        tensors afterwards leaves the rows stale.
        """
        num_seqs = self.seq_lens.shape[0]
        if self.max_query_len == 1 and num_tokens == num_seqs:
            return self
        if self._rows is None or self._rows.seq_lens.shape[0] != num_tokens:
            import torch

            device = self.seq_lens.device
            starts = self.query_start_loc[:-1].long()
            query_lens = self.query_start_loc[1:].long() - starts
            seq = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens,
                                          output_size=num_tokens)
            offsets = torch.arange(num_tokens, device=device) - starts[seq]
            lens = self.seq_lens.long()[seq] - query_lens[seq] + offsets + 1
            self._rows = AttentionMetadata(
                slot_mapping=self.slot_mapping,
                block_tables=self.block_tables.index_select(0, seq),
                seq_lens=lens.to(torch.int32),
                query_start_loc=torch.arange(num_tokens + 1, dtype=torch.int32,
                                             device=device),
                max_query_len=1, max_seq_len=self.max_seq_len)
        return self._rows


@dataclass(frozen=True)
class PagedAttentionParams:
    """What every ``paged_attention`` / ``reshape_and_cache`` call of one layer shares,
    beside the step's :class:`AttentionMetadata`. A backend builds it once per layer, not
    per call (see the ops' contracts in :mod:`hwplug.kernel_registry.ops`).

    ``scale`` multiplies ``q.k``. Key ``k`` is visible to the query at position ``p`` iff
    ``(not causal or k <= p)`` and ``(sliding_window is None or p - k < sliding_window)``;
    logits are soft-capped as ``soft_cap * tanh(logits / soft_cap)`` when ``soft_cap`` is
    set. ``k_scale`` / ``v_scale`` are a quantized (fp8) cache's scales, float32 ``[]`` (per
    tensor) or ``[Hkv]`` (per KV head): stored = ``(x / scale)`` in the cache dtype, read as
    ``stored.float() * scale``; None for a cache that needs none. ``layout`` is the
    :class:`~hwplug.kv_cache_layout.KVCacheLayout` of the cache the calls read and write
    (default: the reference ``NHD``): the ops choose their variant by it. Raises
    :class:`~hwplug.errors.UnsupportedError` for a window without ``causal`` (a window
    trails its query), a window below 1 or a soft cap that is not positive.
    """

    scale: float
    causal: bool = True
    sliding_window: int | None = None
    soft_cap: float | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    layout: KVCacheLayout = NHD

    def __post_init__(self) -> None:
        if self.sliding_window is not None and not self.causal:
            raise UnsupportedError("sliding_window needs causal=True (a window trails its "
                                   "query)")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise UnsupportedError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.soft_cap is not None and self.soft_cap <= 0:
            raise UnsupportedError(f"soft_cap must be > 0, got {self.soft_cap}")


@dataclass(frozen=True)
class InternalFallback:
    """A backend's own fallback, stated as data: when ``condition`` holds, ``path`` serves."""

    condition: str
    path: str


class AttentionBackend(StrictInterface, abc.ABC):
    """Prefill and decode attention over a paged KV cache, for one :class:`AttentionSpec`."""

    _interface_root = True

    #: Platform or family names this backend runs on (see ``Platform.matches``); empty
    #: means any platform.
    platforms: ClassVar[tuple[str, ...]] = ()
    supported_dtypes: ClassVar[tuple[str, ...]] = ()
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ()
    #: Head sizes served; empty means any.
    supported_head_sizes: ClassVar[tuple[int, ...]] = ()
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16,)
    supports_causal: ClassVar[bool] = True
    supports_non_causal: ClassVar[bool] = False
    supports_sliding_window: ClassVar[bool] = False
    supports_soft_cap: ClassVar[bool] = False
    supports_gqa: ClassVar[bool] = True
    #: Device capability range, inclusive (None = no bound).
    min_capability: ClassVar[str | None] = None
    max_capability: ClassVar[str | None] = None
    #: Name of the registered KV-cache layout (:mod:`hwplug.kv_cache_layout`) of the cache
    #: the backend reads and writes; :meth:`kv_cache_shape` asks it for the shape.
    kv_cache_layout: ClassVar[str] = "NHD"
    #: True: :meth:`forward` writes the new K/V into the cache itself. False: the caller
    #: must call :meth:`write_kv_cache` before :meth:`forward` (which the backend then
    #: implements).
    updates_kv_cache_in_forward: ClassVar[bool] = True
    #: The backend's own fallbacks, shown by ``hwplug kernels``.
    internal_fallbacks: ClassVar[tuple[InternalFallback, ...]] = ()
    #: True for a multi-head latent attention backend (:mod:`hwplug.attention_mla`): it
    #: serves exactly the specs whose ``is_mla`` is True, and no other backend does.
    is_mla: ClassVar[bool] = False

    def __init__(self, spec: AttentionSpec, kernels: KernelBinder | None = None) -> None:
        reasons = self.validate(spec)
        if reasons:
            raise UnsupportedError(f"{self.get_name()} cannot serve {spec}: {'; '.join(reasons)}")
        self.spec = spec
        #: Where the backend binds the ops it runs: the model's kernel plan (None: the
        #: process's default plan, for a backend made outside a model).
        self.kernels = kernels
        #: This layer's KV-cache scales when the cache is quantized (fp8): float32
        #: ``[Hkv]`` tensors, set by the model layer that owns the backend and passed to
        #: ``reshape_and_cache`` / ``paged_attention``; None for other caches.
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None

    @classmethod
    @abc.abstractmethod
    def get_name(cls) -> str:
        """The backend's unique registered name (``"TRITON_ATTN"``)."""

    @classmethod
    def kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int,
                       head_size: int) -> tuple[int, ...]:
        """Shape of one layer's cache: what the layout named in ``kv_cache_layout`` says
        (``NHD``: ``[2, num_blocks, block_size, num_kv_heads, head_size]``, K then V)."""
        return registered_layout(cls.kv_cache_layout).shape(num_blocks, block_size,
                                                          num_kv_heads, head_size)

    @classmethod
    def requirements(cls) -> Requirements:
        """The platform, model-dtype and capability requirements the class attributes state
        (override to add device features, toolkit or packages)."""
        return Requirements(platforms=cls.platforms, dtypes=cls.supported_dtypes,
                            min_capability=cls.min_capability,
                            max_capability=cls.max_capability)

    @classmethod
    def validate(cls, spec: AttentionSpec, platform: Platform | None = None) -> list[str]:
        """Reasons this backend cannot serve ``spec`` on ``platform``; empty means it can."""
        reasons = cls.requirements().reasons(platform, spec.dtype)
        if spec.is_mla != cls.is_mla:
            reasons.append("latent (MLA) attention needs an MLA backend" if spec.is_mla
                           else "an MLA backend serves only latent (MLA) attention")
        if platform is not None and cls.kv_cache_layout not in registries.kv_layouts:
            reasons.append(f"KV-cache layout {cls.kv_cache_layout} is not registered "
                           f"(registered: {', '.join(registries.kv_layouts.names())})")
        kv_dtype = spec.kv_cache_dtype or spec.dtype
        if kv_dtype not in cls.supported_kv_cache_dtypes:
            reasons.append(f"KV-cache dtype {kv_dtype} not in "
                           f"{', '.join(cls.supported_kv_cache_dtypes)}")
        if cls.supported_head_sizes and spec.head_size not in cls.supported_head_sizes:
            reasons.append(f"head size {spec.head_size} not in "
                           f"{', '.join(map(str, cls.supported_head_sizes))}")
        if spec.block_size is not None and spec.block_size not in cls.supported_block_sizes:
            reasons.append(f"block size {spec.block_size} not in "
                           f"{', '.join(map(str, cls.supported_block_sizes))}")
        if spec.causal and not cls.supports_causal:
            reasons.append("causal attention not supported")
        if not spec.causal and not cls.supports_non_causal:
            reasons.append("non-causal attention not supported")
        if spec.sliding_window is not None and not cls.supports_sliding_window:
            reasons.append("sliding window not supported")
        if spec.soft_cap is not None and not cls.supports_soft_cap:
            reasons.append("logit soft-cap not supported")
        if spec.num_heads % spec.num_kv_heads:
            reasons.append(f"{spec.num_heads} query heads not a multiple of "
                           f"{spec.num_kv_heads} KV heads")
        elif spec.num_heads != spec.num_kv_heads and not cls.supports_gqa:
            reasons.append("grouped-query attention not supported")
        return reasons

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       metadata: AttentionMetadata) -> None:
        """Store this step's ``key``/``value`` ``[T, Hkv, D]`` at ``metadata.slot_mapping``
        in the backend's layout. A backend that does not update the cache inside
        :meth:`forward` must implement this."""
        raise UnsupportedError(f"{self.get_name()} has no separate KV-cache write step "
                               "(updates_kv_cache_in_forward is True)")

    @abc.abstractmethod
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, metadata: AttentionMetadata,
                scale: float) -> torch.Tensor:
        """Attention of ``query [T, Hq, D]`` over the cached context; returns ``[T, Hq, D]``.

        If ``updates_kv_cache_in_forward`` the backend first stores ``key``/``value``
        ``[T, Hkv, D]`` in ``kv_cache``; otherwise they are already there.
        """
