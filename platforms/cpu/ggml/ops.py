"""The ``ggml_linear`` and ``ggml_embedding`` variants that call ``kernels.c`` through ctypes.

:data:`AVX2`, :data:`VNNI` and :data:`PORTABLE` are the builds (see :mod:`.build`), each a
native library that the variants name (``native``): the registry builds one when it binds a
variant for calls (``ensure_built``), or ``hwplug build`` ahead of time; importing or
reading an op builds nothing, and calling one before its library is built raises
:class:`~hwplug.errors.UnsupportedError`.

``linear`` computes ``x @ W.T`` two ways, chosen by the number of activation rows ``M``:
:meth:`GgmlKernels.linear_blocks`, the C kernel's integer dot products straight from the
GGUF blocks (the weight read once for every 4 activation rows; 8 in the AVX2 builds for
Q4_0, Q4_1 and Q8_0 with int16 activations) with the activations quantized as llama.cpp
does (int8 per super-block of 256 for the super-block types; int16 or int8 per block of 32
for the others), and :meth:`GgmlKernels.linear_tiled`, the weight dequantized by the C
kernel a tile at a time through :func:`~hwplug.platforms.cpu.tiles.linear_by_tiles` (the
fp32 ``linear`` op). Both choices are data, from the ``ggml_linear`` tuning table
(``tuning.json``, measured as :data:`TUNING` says): :func:`tiled_from`, the rows from which
the tiles serve, and :func:`activations_of`, the activations' integer type. ``out`` (a
column slice of a wider fp32 output, as a layer whose rows come in runs of several types
passes) is written in place by the C kernel, so such a layer makes native calls only.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug.errors import UnsupportedError
from hwplug.kernel_registry.reference.ggml import QUANTIZED_TYPES, row_values, type_name
from hwplug.kernel_registry.reference.ggml_repack import REPACKED_TYPES  # repack's types
from hwplug.platforms.cpu.checked_op import checked
from hwplug.platforms.cpu.ggml import build
from hwplug.platforms.cpu.ggml.tuned import (  # TUNING: the table's path, for its readers
    ACTIVATIONS,
    TUNING,  # noqa: F401
    WIDE_TYPES,
    activations_of,
    tiled_from,
)
from hwplug.platforms.cpu.step_graph import native_call
from hwplug.platforms.cpu.tiles import linear_by_tiles

_SERVED = ", ".join(type_name(t) for t in QUANTIZED_TYPES)
_REPACKED = ", ".join(type_name(t) for t in sorted(REPACKED_TYPES))
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
#: The GGUF type of fp32 rows, which the C dequantization copies.
F32 = int(GGMLQuantizationType.F32)


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


class GgmlKernels(build.Library):
    """One build of ``kernels.c``: its ``linear``, ``embedding`` and ``lookup`` have the ops'
    signatures (built by :meth:`~.build.Library.ensure_built` first)."""

    signatures = {
        "hwplug_ggml_linear": [ctypes.c_int, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr, _i64,
                               _ptr, ctypes.c_int, ctypes.c_int],
        "hwplug_ggml_dequantize": [ctypes.c_int, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr,
                                   ctypes.c_int],
        "hwplug_ggml_dequantize_repacked": [ctypes.c_int, _ptr, _i64, _i64, _ptr, _i64, _i64,
                                            _ptr, ctypes.c_int],
        "hwplug_ggml_repack": [ctypes.c_int, _ptr, _i64, _i64, _ptr, ctypes.c_int],
        "hwplug_ggml_linear_repacked": [ctypes.c_int, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr,
                                        _i64, _ptr, ctypes.c_int],
    }

    @checked("linear_supported")
    def linear(self, x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
               bias: torch.Tensor | None = None, out: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The ``ggml_linear`` op on calls :func:`linear_supported` accepts: the integer dots
        below :func:`tiled_from`'s rows (every row count for the types it gives None: then a
        row's outputs do not depend on the rows beside it), the dequantized tiles from
        there; in ``x``'s dtype,
        written to ``out`` when given (in place by the C kernel for a 2-D ``x`` and an fp32
        ``out`` of unit column stride, else copied there)."""
        # a decode step calls this ~120 times: the 2-D fp32 case skips reshape, to and view
        flat = x.dim() == 2
        rows, threads = x if flat else x.reshape(-1, x.shape[-1]), torch.get_num_threads()
        switch = tiled_from(threads)[ggml_type]
        if switch is not None and rows.shape[0] >= switch:
            result = self.linear_tiled.unchecked(rows, qweight, ggml_type, bias)
        else:
            direct = (out is not None and flat and out.dtype == torch.float32
                      and out.stride(-1) == 1)
            result = self.linear_blocks.unchecked(rows, qweight, ggml_type, bias,
                                        activations_of(threads)[ggml_type],
                                        out if direct else None)
            if result is out:
                return out
        if result.dtype != x.dtype:
            result = result.to(x.dtype)
        result = result if flat else result.view(*x.shape[:-1], qweight.shape[0])
        return result if out is None else out.copy_(result)

    @checked("blocks_supported")
    def linear_blocks(self, x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                      bias: torch.Tensor | None = None, activations: str = "int8",
                      out: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 ``x [M, K] @ W.T + bias`` by the C kernel's integer dots on the blocks, ``x``
        quantized to ``activations`` (a key of :data:`ACTIVATIONS`; int16 for
        :data:`WIDE_TYPES` only), written to ``out`` (fp32 ``[M, N]`` of unit column
        stride, any row stride: a column slice of a wider output) when given."""
        return _rows_by_blocks(self.library.hwplug_ggml_linear, x, qweight, ggml_type, bias,
                               out, (ACTIVATIONS[activations],), self._check)

    @checked("repack_supported")
    def repack(self, qweight: torch.Tensor, ggml_type: int) -> torch.Tensor:
        """``qweight`` with each group of 16 rows (the first ``N // 16 * 16``) repacked for the
        VNNI build's 16-row groups (kgroup.h's ``kpack_rows``: the rows' 32-bit words
        interleaved), the rest copied: a new uint8 tensor of ``qweight``'s shape and bytes,
        to hold instead of it, which :meth:`linear_repacked` multiplies. The VNNI build
        repacks :data:`REPACKED_TYPES`; the others raise UnsupportedError."""
        packed = torch.empty_like(qweight)
        native_call(self.library.hwplug_ggml_repack, ggml_type, qweight.data_ptr(),
                    qweight.shape[0], qweight.shape[1], packed.data_ptr(),
                    torch.get_num_threads(), check=self._check_repacked)
        return packed

    @checked("repacked_supported")
    def linear_repacked(self, x: torch.Tensor, packed: torch.Tensor, ggml_type: int,
                        bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                        ) -> torch.Tensor:
        """:meth:`linear_blocks` on weights :meth:`repack` wrote (int8 activations): every
        output bitwise the same as from the rows, whatever the number of rows of ``x``."""
        return _rows_by_blocks(self.library.hwplug_ggml_linear_repacked, x, packed, ggml_type,
                               bias, out, (), self._check_repacked)

    def _check_repacked(self, status: int) -> None:
        if status == -1:
            raise UnsupportedError(f"the ggml CPU kernels' {self.name} build does not repack "
                                   f"(the vnni build repacks {_REPACKED})")
        self._check(status)

    @checked("tiled_supported")
    def linear_tiled(self, x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 ``x [M, K] @ W.T + bias`` with W dequantized a tile of whole rows at a time."""
        def fill(start: int, stop: int, tile: torch.Tensor) -> None:
            self._dequantize(qweight[start:stop], ggml_type, None, tile)

        return linear_by_tiles(_fp32(x), qweight.shape[0], fill, _fp32(bias))

    @checked("embedding_supported")
    def embedding(self, ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int
                  ) -> torch.Tensor:
        """The ``ggml_embedding`` op on calls :func:`embedding_supported` accepts."""
        return self._rows(ids, qweight, ggml_type, self.library.hwplug_ggml_dequantize)

    @checked("embedding_repacked_supported")
    def embedding_repacked(self, ids: torch.Tensor, packed: torch.Tensor, ggml_type: int
                           ) -> torch.Tensor:
        """The ``ggml_embedding_repacked`` op (rows ``ids`` of weights :meth:`repack` wrote,
        each read from its lane of its group): bitwise :meth:`embedding` on the rows."""
        return self._rows(ids, packed, ggml_type, self.library.hwplug_ggml_dequantize_repacked)

    def _rows(self, ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
              function: Callable[..., int]) -> torch.Tensor:
        index = ids.to(torch.int64).contiguous()
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        out = torch.empty((index.shape[0], qweight.shape[1] // size * block),
                          dtype=torch.float32)
        self._dequantize(qweight, ggml_type, index, out, function)
        return out

    @checked("lookup_supported")
    def lookup(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The ``embedding`` op on an fp32 table: its rows copied as GGUF F32 rows."""
        index = ids.to(torch.int64).contiguous()
        out = torch.empty((index.shape[0], weight.shape[1]), dtype=torch.float32)
        self._dequantize(weight.view(torch.uint8), F32, index, out)
        return out

    def _dequantize(self, qweight: torch.Tensor, ggml_type: int, index: torch.Tensor | None,
                    out: torch.Tensor, function: Callable[..., int] | None = None) -> None:
        """Rows ``index`` (None: all) of ``qweight`` into ``out`` (fp32, contiguous, a row
        per index (or row) of the values a row holds: checked, as the kernel writes there)
        by ``function`` (``hwplug_ggml_dequantize``'s arguments; None: that one)."""
        rows = qweight.shape[0] if index is None else index.shape[0]
        if (out.dtype != torch.float32 or not out.is_contiguous() or out.dim() != 2
                or out.shape[0] != rows or qweight.dtype != torch.uint8
                or not qweight.is_contiguous()
                or out.shape[1] != row_values(ggml_type, qweight.shape[1])):
            raise UnsupportedError(f"ggml dequantize into {out.dtype} {list(out.shape)} "
                                   f"from {qweight.dtype} {list(qweight.shape)} "
                                   f"{type_name(ggml_type)} rows: needs contiguous uint8 rows "
                                   f"and a contiguous float32 [{rows}, values per row] out")
        native_call(function or self.library.hwplug_ggml_dequantize, ggml_type, qweight.data_ptr(),
                    qweight.shape[0], qweight.shape[1], _pointer(index), out.shape[0],
                    out.shape[1], out.data_ptr(), torch.get_num_threads(),
                    check=functools.partial(self._check, index=index, rows=qweight.shape[0]))

    def _check(self, status: int, index: torch.Tensor | None = None, rows: int = 0) -> None:
        if status == -2:
            raise MemoryError(f"the ggml CPU kernels ({self.name}) ran out of memory")
        if status == -3:
            raise UnsupportedError(f"token ids must lie in [0, {rows}), got "
                                   f"{int(index.min())} .. {int(index.max())}")
        if status:
            raise UnsupportedError(f"the ggml CPU kernels ({self.name}) returned {status}")


def _fp32(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` as contiguous fp32 (itself when it is already)."""
    if tensor is None or (tensor.dtype == torch.float32 and tensor.is_contiguous()):
        return tensor
    return tensor.to(torch.float32).contiguous()


def _weight_problem(qweight: torch.Tensor, ggml_type: int, k: int) -> str | None:
    if ggml_type not in QUANTIZED_TYPES:
        return f"GGUF type {type_name(ggml_type)} not served (serves {_SERVED})"
    if qweight.dtype != torch.uint8 or qweight.dim() != 2 or not qweight.is_contiguous():
        return (f"needs qweight as contiguous uint8 [N, row_bytes], got {qweight.dtype} "
                f"{list(qweight.shape)}{'' if qweight.is_contiguous() else ' non-contiguous'}")
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if k % block or qweight.shape[1] != k // block * size:
        return (f"rows of {qweight.shape[1]} bytes are not {k} {type_name(ggml_type)} values "
                f"({size}-byte blocks of {block})")
    return None


def linear_supported(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                     bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                     ) -> str | None:
    """Why the C ``ggml_linear`` declines a call, or None."""
    problem = _weight_problem(qweight, ggml_type, x.shape[-1])
    if problem is None and bias is not None and tuple(bias.shape) != (qweight.shape[0],):
        return f"bias of shape {list(bias.shape)} is not [{qweight.shape[0]}]"
    want = (*x.shape[:-1], qweight.shape[0])
    if problem is None and out is not None and (tuple(out.shape) != want
                                                or out.dtype != x.dtype):
        return (f"out {out.dtype} {list(out.shape)} is not {x.dtype} {list(want)}")
    return problem


def blocks_supported(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                     bias: torch.Tensor | None = None, activations: str = "int8",
                     out: torch.Tensor | None = None) -> str | None:
    """Why :meth:`GgmlKernels.linear_blocks` declines a call, or None."""
    if x.dim() != 2:
        return f"x must be 2-D [M, K], got {list(x.shape)}"
    if activations not in ACTIVATIONS or (activations == "int16"
                                          and ggml_type not in WIDE_TYPES):
        return f"activations {activations!r} do not serve {type_name(ggml_type)}"
    want = (x.shape[0], qweight.shape[0]) if qweight.dim() == 2 else None
    if out is not None and (out.dtype != torch.float32 or tuple(out.shape) != want
                            or out.stride(-1) != 1):
        return f"out {out.dtype} {list(out.shape)} is not float32 {list(want or ())} of unit " \
               "column stride"
    return linear_supported(x, qweight, ggml_type, bias)


def _rows_by_blocks(function: Callable[..., int], x: torch.Tensor, qweight: torch.Tensor,
                    ggml_type: int, bias: torch.Tensor | None, out: torch.Tensor | None,
                    options: tuple, check: Callable[[int], None]) -> torch.Tensor:
    """``function`` (``hwplug_ggml_linear``'s arguments, ``options`` before the threads)."""
    rows, fp32_bias = _fp32(x), _fp32(bias)
    (m, k), (n, row_bytes) = rows.shape, qweight.shape
    if out is None:
        out = torch.empty(m, n, dtype=torch.float32)
    if m:
        native_call(function, ggml_type, qweight.data_ptr(), row_bytes, n, k, rows.data_ptr(),
                    m, out.data_ptr(), out.stride(0), _pointer(fp32_bias), *options,
                    torch.get_num_threads(), check=check)
    return out


def repack_supported(qweight: torch.Tensor, ggml_type: int) -> str | None:
    """Why :meth:`GgmlKernels.repack` declines a weight, or None."""
    if ggml_type not in REPACKED_TYPES:
        return f"GGUF type {type_name(ggml_type)} is not repacked (repacks {_REPACKED})"
    if qweight.dim() != 2:
        return f"needs qweight as uint8 [N, row_bytes], got {list(qweight.shape)}"
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return _weight_problem(qweight, ggml_type, qweight.shape[1] // size * block)


def repacked_supported(x: torch.Tensor, packed: torch.Tensor, ggml_type: int,
                       bias: torch.Tensor | None = None, out: torch.Tensor | None = None
                       ) -> str | None:
    """Why :meth:`GgmlKernels.linear_repacked` declines a call, or None."""
    return repack_supported(packed, ggml_type) or blocks_supported(x, packed, ggml_type, bias,
                                                                   "int8", out)


def tiled_supported(x: torch.Tensor, qweight: torch.Tensor, ggml_type: int,
                    bias: torch.Tensor | None = None) -> str | None:
    """Why :meth:`GgmlKernels.linear_tiled` declines a call, or None."""
    if x.dim() != 2:
        return f"x must be 2-D [M, K], got {list(x.shape)}"
    return linear_supported(x, qweight, ggml_type, bias)


def _ids_problem(ids: torch.Tensor) -> str | None:
    if ids.dim() != 1 or ids.dtype not in (torch.int64, torch.int32):
        return f"ids must be 1-D int64 or int32, got {ids.dtype} {list(ids.shape)}"
    return None


def embedding_supported(ids: torch.Tensor, qweight: torch.Tensor, ggml_type: int) -> str | None:
    """Why the C ``ggml_embedding`` declines a call, or None (ids outside the weight's
    rows are the kernel's error)."""
    if problem := _ids_problem(ids):
        return problem
    if ggml_type not in QUANTIZED_TYPES or qweight.dtype != torch.uint8:
        return _weight_problem(qweight, ggml_type, 0)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    return _weight_problem(qweight, ggml_type, qweight.shape[-1] // size * block)


def embedding_repacked_supported(ids: torch.Tensor, packed: torch.Tensor, ggml_type: int
                                 ) -> str | None:
    """Why :meth:`GgmlKernels.embedding_repacked` declines a call, or None."""
    return repack_supported(packed, ggml_type) or embedding_supported(ids, packed, ggml_type)


def lookup_supported(ids: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the C ``embedding`` declines a call, or None (ids outside the table's rows are
    the kernel's error)."""
    if problem := _ids_problem(ids):
        return problem
    if weight.dtype != torch.float32 or weight.dim() != 2 or not weight.is_contiguous():
        return (f"needs a contiguous float32 [V, H] table, got {weight.dtype} "
                f"{list(weight.shape)}")
    return None


#: The build for x86-64 CPUs with AVX2, FMA and F16C.
AVX2 = GgmlKernels("avx2")
#: The AVX2 build with AVX-512 VNNI int8 dot products (CPUs with AVX512-VNNI and -VL).
VNNI = GgmlKernels("vnni")
#: The build of plain C for every other CPU.
PORTABLE = GgmlKernels("portable")
