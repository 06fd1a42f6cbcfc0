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
from pathlib import Path

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from hwplug import envs
from hwplug.errors import ConfigError, UnsupportedError
from hwplug.kernel_registry.reference.ggml import QUANTIZED_TYPES, row_values, type_name
from hwplug.kernel_registry.reference.ggml_repack import REPACKED_TYPES  # repack's types
from hwplug.kernel_registry.tuning import TuningTable, read_layer
from hwplug.platforms.cpu.checked_op import checked
from hwplug.platforms.cpu.ggml import build
from hwplug.platforms.cpu.probe import probe
from hwplug.platforms.cpu.step_graph import native_call
from hwplug.platforms.cpu.tiles import linear_by_tiles
from hwplug.platforms.device_names import canonical_device_name

#: hwplug's layer of the ``ggml_linear`` tuning table: ``{device: {threads: {type name:
#: activation rows from which it takes the tiles (null: never), "activations": {type name:
#: "int16" | "int8"}}}}``. Its one entry, ``default`` at one thread, serves every CPU and thread
#: count until a table says otherwise; measured on a 2-core AVX2 EPYC in SmolLM2 Q4_1 decode
#: steps (benchmarks/decode_profile.py with a user table; benchmarks/ggml_linear.py, whose
#: back-to-back calls flatter the tiles, misplaces the switch): with the AVX2 build's
#: eight-row tiles (Q4_0, Q4_1, Q8_0) the integer kernel took 79 ms of a batch-32 step,
#: 158 against the tiles' 178 at 64 rows and 268 against 282 at 128, and the tiles never
#: serve them (null), so a row's outputs do not depend on the rows of its step (batch
#: invariance, docs/generation.md "Numerics"); since the VNNI build's 16-row chunks
#: (lgroup.h) the integer kernel beats the tiles at 32-512 rows (SmolLM2 Q4_1's shapes,
#: one thread, CPU time: 1.2-1.5x; the AVX2 build, without them, took 1.2-1.4x the tiles'
#: time before its tiles of eight pairs, not measured since). Q5_0 and Q5_1 never take the
#: tiles either (null) since the VNNI build's 16-row chunks (lgroup.h): their int16 kernel
#: took 0.35-0.98x the tiles' time at 32-512 rows (that Zen 5, one thread, CPU time, loaded;
#: 576x576 and 1536x8960). The activations of the 32-value types are int16 (max|x| /
#: 32767 steps: errors ~1e-4 of the outputs' rms, and SmolLM2 Q4_1's greedy tokens those of
#: fp32) where that costs at most ~15% over int8 at one row (measured: 0-5%); Q8_0 keeps
#: int16: its int8 dots (VNNI) measured level with int16 (a 2-vCPU AMD EPYC Zen 5, one
#: thread, Qwen2.5-1.5B's shapes: 92-810 against 98-743 µs, memory-bound at ~25 GB/s).
#: IQ4_NL and the super-block types (Q2_K .. Q6_K, IQ4_XS) take int8 only, as llama.cpp
#: does (Q8_0 and Q8_K activations). The super-block types never take the tiles (null):
#: their VNNI build's 16-row groups (kgroup.h) beat the tiles by 2.7-4.8x at 128-512 rows
#: (that Zen 5, quiet, two threads, Qwen2.5-1.5B's 1536x1536, 8960x1536 and 1536x8960, Q4_K
#: and Q6_K: 1.0-24 ms against 2.7-101), and their AVX2 build's tiles were about level with
#: the fp32 tiles at 128 rows (Q4_K 6299 / 8787 µs, Q6_K 5972 / 7780 and 50687 / 37338, one
#: thread, a loaded machine), so prefill stays batch-invariant for them too. IQ4_NL's
#: integer kernel was level with the tiles at 32 rows (2437 / 2445 µs), hence 32.
TUNING = Path(__file__).with_name("tuning.json")
#: The activations' integer types and their bits, as the C kernel takes them.
ACTIVATIONS = {"int8": 8, "int16": 16}
#: The GGUF types whose C kernel also takes int16 activations.
WIDE_TYPES = frozenset(int(GGMLQuantizationType[name])
                       for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"))
_SERVED = ", ".join(type_name(t) for t in QUANTIZED_TYPES)
_REPACKED = ", ".join(type_name(t) for t in sorted(REPACKED_TYPES))
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
#: The GGUF type of fp32 rows, which the C dequantization copies.
F32 = int(GGMLQuantizationType.F32)


@functools.cache
def _cpu_name() -> str:
    """This CPU's canonical name (``"epyc-9654"``), from the CPU probe: the tuning tables'
    device key."""
    return canonical_device_name(probe(envs.HWPLUG_PROBE_ROOT).devices[0])


def _config(threads: int) -> dict:
    """The ``ggml_linear`` tuning table's entry on this CPU with ``threads`` threads
    (:data:`TUNING` < ``$HWPLUG_TUNING_DIR/ggml_linear.json``), keyed by the CPU's
    canonical name (else ``default``) and bucketed by thread count. A type the user's
    entry leaves out keeps hwplug's values."""
    device = _cpu_name()
    layer = read_layer(TUNING)
    own = TuningTable("ggml_linear", layer, user_dir=TUNING.parent)  # no user file there
    user = TuningTable("ggml_linear", layer).lookup(device, threads)
    own = own.lookup(device, threads)
    return {**own, **user, "activations": {**own["activations"], **user.get("activations", {})}}


@functools.cache
def tiled_from(threads: int) -> dict[int, int | None]:
    """GGUF type -> activation rows from which ``linear`` takes the tiles, or None where it
    never does, on this CPU with ``threads`` threads (the tuning table, see
    :func:`_config`)."""
    config = _config(threads)
    return {int(GGMLQuantizationType[name]): rows for name, rows in config.items()
            if name != "activations"}


@functools.cache
def activations_of(threads: int) -> dict[int, str]:
    """GGUF type -> the activations' integer type (``"int16"`` or ``"int8"``) with which
    ``linear`` computes below :func:`tiled_from`'s rows (the tuning table, see
    :func:`_config`). Raises :class:`ConfigError` for another value, or ``"int16"`` for a
    type outside :data:`WIDE_TYPES`."""
    chosen = _config(threads)["activations"]
    for name, value in chosen.items():
        if value not in ACTIVATIONS:
            raise ConfigError(f"ggml_linear tuning table: activations {value!r} for {name} is "
                              f"not one of {', '.join(ACTIVATIONS)}")
        if value == "int16" and int(GGMLQuantizationType[name]) not in WIDE_TYPES:
            raise ConfigError(f"ggml_linear tuning table: {name} takes int8 activations only "
                              f"(int16: {', '.join(type_name(t) for t in sorted(WIDE_TYPES))})")
    return {int(GGMLQuantizationType[name]): value for name, value in chosen.items()}


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
        index = ids.to(torch.int64).contiguous()
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        out = torch.empty((index.shape[0], qweight.shape[1] // size * block),
                          dtype=torch.float32)
        self._dequantize(qweight, ggml_type, index, out)
        return out

    @checked("lookup_supported")
    def lookup(self, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The ``embedding`` op on an fp32 table: its rows copied as GGUF F32 rows."""
        index = ids.to(torch.int64).contiguous()
        out = torch.empty((index.shape[0], weight.shape[1]), dtype=torch.float32)
        self._dequantize(weight.view(torch.uint8), F32, index, out)
        return out

    def _dequantize(self, qweight: torch.Tensor, ggml_type: int, index: torch.Tensor | None,
                    out: torch.Tensor) -> None:
        """Rows ``index`` (None: all) of ``qweight`` into ``out`` (fp32, contiguous, a row
        per index (or row) of the values a row holds: checked, as the kernel writes there)."""
        rows = qweight.shape[0] if index is None else index.shape[0]
        if (out.dtype != torch.float32 or not out.is_contiguous() or out.dim() != 2
                or out.shape[0] != rows or qweight.dtype != torch.uint8
                or not qweight.is_contiguous()
                or out.shape[1] != row_values(ggml_type, qweight.shape[1])):
            raise UnsupportedError(f"ggml dequantize into {out.dtype} {list(out.shape)} "
                                   f"from {qweight.dtype} {list(qweight.shape)} "
                                   f"{type_name(ggml_type)} rows: needs contiguous uint8 rows "
                                   f"and a contiguous float32 [{rows}, values per row] out")
        native_call(self.library.hwplug_ggml_dequantize, ggml_type, qweight.data_ptr(),
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
