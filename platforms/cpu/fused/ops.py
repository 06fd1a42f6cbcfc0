"""``rms_norm``, ``silu_and_mul``, ``rotary_embedding``, causal ``paged_attention``,
``reshape_and_cache`` and fp32 ``linear`` variants that call ``kernels.c`` through
ctypes, fp32.

:data:`AVX2` and :data:`PORTABLE` are the two builds, compiled and cached by
:mod:`hwplug.platforms.cpu.ggml.build` when the registry binds a variant naming one as its
``native`` library (or by ``hwplug build``), so a failed build is the variant's rejection
reason; calling an op before its library is built raises. Each op runs its
``*_supported`` function first (:func:`~hwplug.platforms.cpu.checked_op.checked`: a
wrong dtype, shape or layout is an :class:`~hwplug.errors.UnsupportedError`, never a write
past a buffer; the registry's variants call the ``unchecked`` form, having asked
``supports``) and allocates only its outputs, in the dtype the kernel writes: a call is one
ctypes call (argtypes set once, made through
:func:`~hwplug.platforms.cpu.step_graph.native_call`, so a step of these ops can be a step
graph) plus the outputs.
"""

from __future__ import annotations

import ctypes
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hwplug.errors import UnsupportedError
from hwplug.platforms.cpu.checked_op import checked
from hwplug.platforms.cpu.ggml import build
from hwplug.platforms.cpu.kernels import rows_problem
from hwplug.platforms.cpu.step_graph import native_call

if TYPE_CHECKING:
    from hwplug.attention import AttentionMetadata, PagedAttentionParams

SOURCE = Path(__file__).with_name("kernels.c")
#: Limits of the decode attention kernel's per-thread buffers (kernels.c).
MAX_GROUP, MAX_HEAD = 16, 256
_i64, _ptr, _int, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "hwplug_rms_norm": [_ptr, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _f32, _int],
    "hwplug_silu_and_mul": [_ptr, _ptr, _i64, _i64, _int],
    "hwplug_rotary": [_ptr, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _ptr, _i64, _i64, _ptr,
                      _i64, _i64, _int],
    "hwplug_cache_write": [_ptr, _i64, _ptr, _i64, _ptr, _i64, _i64, _ptr, _i64],
    "hwplug_linear_f32": [_ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64, _int],
    "hwplug_paged_decode": [_ptr, _i64, _ptr, _i64, _i64, _i64, _i64, _ptr, _i64, _i64, _ptr,
                            _i64, _i64, _f32, _i64, _f32, _ptr, _int],
}


class FusedKernels(build.Library):
    """One build of ``kernels.c``; its methods are the ops, with the ops' signatures (built
    by :meth:`~hwplug.platforms.cpu.ggml.build.Library.ensure_built` first)."""

    source = SOURCE
    signatures = _SIGNATURES

    @checked("rms_norm_supported")
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None
                 ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The ``rms_norm`` op on calls :func:`rms_norm_supported` accepts (contiguous
        outputs)."""
        out = torch.empty(x.shape, dtype=x.dtype)
        summed = None if residual is None else torch.empty_like(x)
        hidden = x.shape[-1]
        group, ldx = _row_groups(x)  # type: ignore[misc]
        native_call(self.library.hwplug_rms_norm, x.data_ptr(), group, ldx,
                    None if residual is None else residual.data_ptr(), out.data_ptr(),
                    None if summed is None else summed.data_ptr(), weight.data_ptr(),
                    x.numel() // max(hidden, 1), hidden, eps, torch.get_num_threads())
        return out if summed is None else (out, summed)

    @checked("silu_and_mul_supported")
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """The ``silu_and_mul`` op on calls :func:`silu_and_mul_supported` accepts."""
        half = x.shape[-1] // 2
        out = torch.empty((*x.shape[:-1], half), dtype=x.dtype)
        native_call(self.library.hwplug_silu_and_mul, x.data_ptr(), out.data_ptr(),
                    x.numel() // x.shape[-1], half, torch.get_num_threads())
        return out

    @checked("rotary_supported")
    def rotary_embedding(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                         cos_sin_cache: torch.Tensor, is_neox: bool
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``rotary_embedding`` op on calls :func:`rotary_supported` accepts."""
        tokens, heads, size = query.shape
        q_out = torch.empty((tokens, heads, size), dtype=query.dtype)
        k_out = torch.empty(key.shape, dtype=key.dtype)
        native_call(
            self.library.hwplug_rotary, positions.data_ptr(), cos_sin_cache.data_ptr(),
            cos_sin_cache.shape[0], cos_sin_cache.shape[1], query.data_ptr(), query.stride(0),
            heads, q_out.data_ptr(), key.data_ptr(), key.stride(0), key.shape[1],
            k_out.data_ptr(), tokens, size, int(is_neox),
            check=partial(_positions_outside, positions, cos_sin_cache.shape[0]))
        return q_out, k_out

    @checked("decode_supported")
    def paged_attention(self, query: torch.Tensor, kv_cache: torch.Tensor,
                        metadata: AttentionMetadata, params: PagedAttentionParams
                        ) -> torch.Tensor:
        """The causal ``paged_attention`` op on calls :func:`decode_supported` accepts: a
        verify step or a prefill as one decode row per query (``metadata.decode_rows``), so a
        query's output does not depend on the batch or the step it is in."""
        metadata = metadata.decode_rows(query.shape[0])
        _, num_blocks, block_size, kv_heads, size = kv_cache.shape
        block_tables, seq_lens = metadata.block_tables, metadata.seq_lens
        out = torch.empty((query.shape[0], query.shape[1], size), dtype=query.dtype)
        native_call(
            self.library.hwplug_paged_decode, query.data_ptr(), query.stride(0),
            kv_cache.data_ptr(), num_blocks, block_size, kv_heads, size, block_tables.data_ptr(),
            block_tables.stride(0), block_tables.shape[1], seq_lens.data_ptr(),
            seq_lens.shape[0], query.shape[1],
            params.scale, params.sliding_window or 0, params.soft_cap or 0.0, out.data_ptr(),
            torch.get_num_threads(), check=partial(_decode_failed, num_blocks, block_tables))
        return out

    @checked("cache_write_supported")
    def reshape_and_cache(self, key: torch.Tensor, value: torch.Tensor,
                          kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                          params: PagedAttentionParams) -> None:
        """The ``reshape_and_cache`` op on calls :func:`cache_write_supported` accepts."""
        num_slots = kv_cache.shape[1] * kv_cache.shape[2]
        native_call(
            self.library.hwplug_cache_write, key.data_ptr(), key.stride(0), value.data_ptr(),
            value.stride(0), kv_cache.data_ptr(), num_slots, key.shape[1] * key.shape[2],
            slot_mapping.data_ptr(), key.shape[0],
            check=partial(_slots_outside, slot_mapping, num_slots))

    @checked("linear_supported")
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The fp32 ``linear`` op on calls :func:`linear_supported` accepts."""
        n, k = weight.shape
        out = torch.empty(x.shape[:-1] + (n,), dtype=torch.float32)
        native_call(self.library.hwplug_linear_f32, x.data_ptr(), x.numel() // k,
                    weight.data_ptr(), None if bias is None else bias.data_ptr(),
                    out.data_ptr(), n, k, torch.get_num_threads())
        return out


def _positions_outside(positions: torch.Tensor, rows: int, status: int) -> None:
    raise UnsupportedError(f"positions must lie in [0, {rows}) (the cos_sin_cache's rows), "
                           f"got {positions.min().item()} .. {positions.max().item()}")


def _decode_failed(num_blocks: int, block_tables: torch.Tensor, status: int) -> None:
    if status == -3:
        raise MemoryError("paged_attention: no memory for the kernel's list of row runs")
    if status == -2:
        raise UnsupportedError(f"paged_attention: seq_lens holds a length past the "
                               f"{block_tables.shape[1]} "
                               f"blocks of a block table row (or below 0)")
    raise UnsupportedError(f"paged_attention: a block table entry read lies outside the "
                           f"cache's {num_blocks} blocks")


def _slots_outside(slot_mapping: torch.Tensor, num_slots: int, status: int) -> None:
    raise UnsupportedError(f"slot_mapping holds a slot past the cache's {num_slots} slots "
                           f"(max {slot_mapping.max().item()})")


def _fp32_rows(name: str, tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` is not fp32 with contiguous rows, or None."""
    if tensor.dtype != torch.float32:
        return f"{name}: float32 only, got {tensor.dtype}"
    return None if tensor.is_contiguous() else f"{name}: needs a contiguous tensor"


def _row_groups(x: torch.Tensor) -> tuple[int, int] | None:
    """``(rows per group, floats between groups)`` of ``x``'s rows as the C ``rms_norm``
    reads them: all in one group when ``x`` is contiguous; a ``[T, rows, D]`` view whose
    tokens sit apart (each token's rows contiguous, as Qwen3's q/k-norm sees the heads of a
    fused qkv output) in one group per token; else None."""
    hidden = x.shape[-1] if x.dim() else 0
    if x.is_contiguous():
        rows = max(x.numel() // max(hidden, 1), 1)
        return rows, rows * hidden
    if x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == hidden and \
            x.stride(0) >= x.shape[1] * hidden:
        return x.shape[1], x.stride(0)
    return None


def rms_norm_supported(x: torch.Tensor, weight: torch.Tensor, eps: float,
                       residual: torch.Tensor | None = None) -> str | None:
    """Why the C ``rms_norm`` declines a call, or None: fp32, ``x`` contiguous or (without
    a residual) a ``[T, rows, D]`` view whose tokens sit apart (see :func:`_row_groups`)."""
    tensors = {"weight": weight, **({} if residual is None else {"residual": residual})}
    for name, tensor in tensors.items():
        if problem := _fp32_rows(name, tensor):
            return problem
    if x.dtype != torch.float32:
        return f"x: float32 only, got {x.dtype}"
    if not x.is_contiguous() and (residual is not None or _row_groups(x) is None):
        return ("x: needs a contiguous tensor, or (without a residual) [T, rows, D] whose "
                f"tokens sit apart with each token's rows contiguous, got strides {x.stride()}")
    if weight.shape != x.shape[-1:] or (residual is not None and residual.shape != x.shape):
        return (f"needs weight [{x.shape[-1]}] and residual of x's shape, got weight "
                f"{list(weight.shape)}"
                f"{'' if residual is None else f', residual {list(residual.shape)}'}")
    return None


def silu_and_mul_supported(x: torch.Tensor) -> str | None:
    """Why the C ``silu_and_mul`` declines a call, or None."""
    if x.dim() == 0 or x.shape[-1] % 2 or not x.shape[-1]:
        return f"needs an even, nonzero last dimension, got {list(x.shape)}"
    return _fp32_rows("x", x)


def _heads(name: str, tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` is not fp32 ``[T, H, D]`` with contiguous heads, or None."""
    if tensor.dtype != torch.float32 or tensor.dim() != 3:
        return f"{name}: float32 [T, H, D] only, got {tensor.dtype} {list(tensor.shape)}"
    if tensor.stride(2) != 1 or tensor.stride(1) != tensor.shape[2]:
        return f"{name}: needs each token's heads contiguous, got strides {tensor.stride()}"
    return None


def rotary_supported(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> str | None:
    """Why the C ``rotary_embedding`` declines a call, or None."""
    for name, tensor in (("query", query), ("key", key)):
        if problem := _heads(name, tensor):
            return problem
    if positions.dtype != torch.int64 or not positions.is_contiguous() or \
            positions.shape != query.shape[:1]:
        return (f"positions: contiguous int64 [T] beside query of T tokens, got "
                f"{positions.dtype} {list(positions.shape)}")
    if problem := _fp32_rows("cos_sin_cache", cos_sin_cache):
        return problem
    rot = cos_sin_cache.shape[-1]
    if rot % 2 or rot > query.shape[2] or key.shape[::2] != query.shape[::2]:
        return (f"needs an even rot_dim <= head size and key [T, Hkv, D] beside query "
                f"{list(query.shape)}, got rot_dim {rot}, key {list(key.shape)}")
    return None


def decode_supported(query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                     params: PagedAttentionParams) -> str | None:
    """Why the C ``paged_attention`` declines a call, or None: it serves decode batches and
    causal batches of any query length (prefill chunks too: per query row it is faster
    than the reference's SDPA, and the same numbers as a decode step)."""
    if problem := rows_problem(query, metadata, params, max_query_len=None):
        return problem
    if kv_cache.dtype != torch.float32 or params.k_scale is not None or \
            params.v_scale is not None:
        return f"needs an fp32 KV cache without k/v scales (fp8 not done), got {kv_cache.dtype}"
    if problem := _heads("query", query):
        return problem
    if not kv_cache.is_contiguous():
        return "needs a contiguous kv_cache"
    size, kv_heads = kv_cache.shape[4], kv_cache.shape[3]
    if size % 8 or size > MAX_HEAD or query.shape[2] != size:
        return f"needs the head size a multiple of 8 up to {MAX_HEAD}, got {size}"
    if query.shape[1] % kv_heads or query.shape[1] // kv_heads > MAX_GROUP:
        return f"needs up to {MAX_GROUP} query heads per KV head, got {query.shape[1]}/{kv_heads}"
    for name in ("block_tables", "seq_lens"):
        tensor = getattr(metadata, name)
        if tensor.dtype != torch.int32 or tensor.stride(-1) != 1:
            return f"{name}: int32 with contiguous rows only, got {tensor.dtype}"
    tables = metadata.block_tables
    num_seqs = metadata.seq_lens.shape[0]  # a verify step's queries share their row
    if tables.dim() != 2 or tables.shape[0] < num_seqs or metadata.seq_lens.dim() != 1:
        return (f"needs a block table row per sequence, got block_tables "
                f"{list(tables.shape)} for {num_seqs} sequences")
    return None


def cache_write_supported(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                          slot_mapping: torch.Tensor, params: PagedAttentionParams
                          ) -> str | None:
    """Why the C ``reshape_and_cache`` declines a call, or None."""
    if kv_cache.dtype != torch.float32 or params.k_scale is not None or \
            params.v_scale is not None:
        return f"needs an fp32 KV cache without k/v scales, got {kv_cache.dtype}"
    if not kv_cache.is_contiguous():
        return "needs a contiguous kv_cache"
    for name, tensor in (("key", key), ("value", value)):
        if problem := _heads(name, tensor):
            return problem
        if tuple(tensor.shape[1:]) != tuple(kv_cache.shape[3:]):
            return (f"{name} {list(tensor.shape)} does not match the cache's [Hkv, D] "
                    f"{list(kv_cache.shape[3:])}")
    if slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous() or \
            slot_mapping.shape != key.shape[:1] or value.shape[0] != key.shape[0]:
        return (f"slot_mapping: contiguous int64 [T] beside key and value of T tokens, got "
                f"{slot_mapping.dtype} {list(slot_mapping.shape)}")
    return None


def linear_supported(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
                     ) -> str | None:
    """Why the C ``linear`` declines a call, or None."""
    for name, tensor in (("x", x), ("weight", weight), ("bias", bias)):
        if tensor is not None and (problem := _fp32_rows(name, tensor)):
            return problem
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1] or x.shape[-1] % 8:
        return (f"needs weight [N, K] with K = x's {x.shape[-1]}, a multiple of 8, got "
                f"{list(weight.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        return f"bias of shape {list(bias.shape)} is not [{weight.shape[0]}]"
    return None


#: The build for x86-64 CPUs with AVX2 and FMA.
AVX2 = FusedKernels("avx2")
#: The build of plain C for every other CPU.
PORTABLE = FusedKernels("portable")

