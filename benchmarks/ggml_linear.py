"""``ggml_linear`` on GGUF blocks vs an earlier revision's C kernel, fp32 GEMMs and the op's
reference, side by side.

Shapes: SmolLM2-135M's four GEMMs per decoder layer (fused q/k/v 576 -> 960, o 576 -> 576,
fused gate/up 576 -> 3072, down 1536 -> 576) and its tied LM head (576 -> 49152, Q8_0 in
the shipped GGUF), or ``--shapes`` as ``NxK`` (output rows x inputs: ``1536x1536,
8960x1536,1536x8960,256x1536`` are Qwen2.5-1.5B's o, gate/up, down and k/v;
``3072x8192,14336x4096`` Llama-3.2-3B's down and Llama-3.1-8B's gate/up), for each GGUF
type, at ``--tokens`` rows (K-quants need inputs in multiples of 256: other shapes show
n/a). Like a decode step, each call reads the next of several copies of the weight (at
least ``--layers``, and enough to fill ``--cycle-mb`` MiB), so the weights come from
memory, not from a cache that holds one layer.

Columns, microseconds per call: ``ggml`` (the op as dispatched here: the cpu platform's
best C variant, which takes the integer kernel below the tuned number of rows and
dequantized tiles from there on), ``GB/s`` (the weight bytes ``ggml`` read per second),
``base`` (``--baseline``'s C kernel, by default the revision ``main`` names, built from its
``kernels.c`` with its flags for the build the op takes here and called with its tuned activations and switch, the
tiles past it; n/a where it does not serve the type) and ``base GB/s``, ``avx2`` (this
AVX2 build's op on a CPU with VNNI too), ``int16`` and ``int8`` (the integer kernel with
each activation type) and ``tiles`` (each path alone), ``base int8`` (the baseline's
integer kernel with int8 activations at every row count; like ``base``, called straight
through ctypes without the op's checks, a few µs a call less than ``int8``), ``repacked`` (the VNNI build's
integer kernel on the weight repacked once into 16-row groups, Q4_K, Q5_K, Q6_K and IQ4_XS: n/a for the
others and on CPUs without VNNI), ``rep GB/s``, ``base rep`` (the baseline's repacking and
its kernel on it: n/a where the baseline does not repack), ``portable`` (the build for CPUs
without AVX2), ``fp32`` (the ``linear`` op on the dequantized weight as dispatched here)
and plain ``F.linear``, and the op's ``reference`` (dequantize, then ``F.linear``).
Ratios: the baseline's time over ``ggml``'s (above 1: ggml is faster), then fp32's,
the reference's and the repacked kernel's (below 1: the repacked weight is faster), and
the baseline's repacked kernel's over this one's (``brep/rep``, above 1: this one is faster)
and the baseline's int8 kernel's over this one's (``b8/int8``). The CPU is named as the probe reads it (lscpu's ``Model name``).

    python benchmarks/ggml_linear.py [--types Q4_0,Q4_1,Q8_0,Q4_K,Q6_K] [--tokens 1,8,32]
                                     [--shapes 1536x1536,8960x1536] [--layers 30]
                                     [--cycle-mb 256] [--repeat 5] [--threads N]
                                     [--baseline main] [--no-lm-head] [--cpu-time]
                                     [--columns ggml,GB/s,base,base GB/s,fp32]

``--columns`` times only those (a ratio whose columns are left out shows as n/a).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import platform as host
import time
import timeit
from collections.abc import Callable

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402
from revision_files import files_at  # noqa: E402

from hwplug import kernels, ops  # noqa: E402
from hwplug.kernel_registry.ops_ggml import ggml_linear  # noqa: E402
from hwplug.kernel_registry.reference.ggml import dequantize  # noqa: E402
from hwplug.kernel_registry.reference.ggml_weights import ggml_block, ggml_weight  # noqa: E402
from hwplug.platforms.cpu.ggml import build as c_build  # noqa: E402
from hwplug.platforms.cpu.ggml import ops as c_kernels  # noqa: E402

#: (name, input, output) of SmolLM2-135M's GEMMs per decoder layer.
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
#: Its tied LM head: one copy, as the GGUF stores it.
HEAD = ("lm_head", 576, 49152)
COLUMNS = ("ggml", "GB/s", "base", "base GB/s", "avx2", "int16", "int8", "base int8", "repacked",
           "rep GB/s", "base rep", "tiles", "portable", "fp32", "F.linear", "reference")
#: The build of each ``ggml_linear`` variant (the baseline is built the same way).
BUILD_OF = {"ggml_vnni": "vnni", "ggml_avx2": "avx2", "ggml_c": "portable"}
#: The columns computed from another's time rather than timed.
RATES = {"GB/s": "ggml", "base GB/s": "base", "rep GB/s": "repacked"}
#: Seconds of calls each timing aims at (at least one call).
BUDGET_S = 0.05


#: The clock every timing reads: wall time, or the process's CPU time (``--cpu-time``).
TIMER = {"wall": timeit.default_timer, "cpu": time.process_time}


def interleaved_us(columns: dict[str, Callable[[], object]], calls_per_run: dict[str, int],
                   repeat: int, timer: Callable[[], float] = timeit.default_timer
                   ) -> dict[str, float]:
    """Each column's best time of one of the ``calls_per_run[column]`` calls its function
    makes, read on ``timer``, the columns timed in turn in each of ``repeat`` rounds (so all
    see the same machine)."""
    numbers = {}
    for column, fn in columns.items():
        start = timer()
        fn()  # first run: dispatch, packing, caches warm
        numbers[column] = max(1, int(BUDGET_S / max(timer() - start, 1e-6)))
    best = dict.fromkeys(columns, float("inf"))
    for _ in range(repeat):
        for column, fn in columns.items():
            seconds = timeit.timeit(fn, number=numbers[column], timer=timer) / numbers[column]
            best[column] = min(best[column], seconds / calls_per_run[column] * 1e6)
    return best


class Baseline:
    """An earlier revision's ``kernels.c`` (and its headers), built with that revision's
    flags for ``build`` (the build the op takes here), and its tuning table: its integer
    kernel below its tuned rows, this revision's tiles (the same code) from there."""

    def __init__(self, rev: str, build: str) -> None:
        folder = files_at(rev, "platforms/cpu/ggml/", (".c", ".h", ".json"), "hwplug-ggml",
                          "ggml_baseline")
        library = c_build.Library(build)
        library.source = folder / "kernels.c"
        library.ensure_built()
        self.function = library.library.hwplug_ggml_linear
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        self.function.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64, ptr, i64, ptr,
                                  ctypes.c_int, ctypes.c_int]
        #: that revision's repacking and its kernel on the repacked weight (None before it)
        self.repack_function = getattr(library.library, "hwplug_ggml_repack", None)
        self.repacked_function = getattr(library.library, "hwplug_ggml_linear_repacked", None)
        if self.repacked_function is not None:
            self.repack_function.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, ctypes.c_int]
            self.repacked_function.argtypes = [ctypes.c_int, ptr, i64, i64, i64, ptr, i64, ptr,
                                               i64, ptr, ctypes.c_int]
        table = json.loads((folder / "tuning.json").read_text())["default"]["1"]
        self.rows = {int(GGMLQuantizationType[n]): v for n, v in table.items()
                     if n != "activations"}
        self.bits = {int(GGMLQuantizationType[n]): c_kernels.ACTIVATIONS[v]
                     for n, v in table["activations"].items()}
        self.rev = rev

    def serves(self, kind: int) -> bool:
        return kind in self.rows

    def repack(self, qweight: torch.Tensor, kind: int) -> torch.Tensor | None:
        """``qweight`` repacked by that revision (None where it does not repack ``kind``)."""
        if self.repacked_function is None:
            return None
        packed = torch.empty_like(qweight)
        if self.repack_function(kind, qweight.data_ptr(), qweight.shape[0], qweight.shape[1],
                                packed.data_ptr(), torch.get_num_threads()):
            return None
        return packed

    def linear_repacked(self, x: torch.Tensor, packed: torch.Tensor, kind: int
                        ) -> torch.Tensor:
        """``x @ W.T`` by that revision's kernel on the weight it repacked."""
        (m, k), (n, row_bytes) = x.shape, packed.shape
        out = torch.empty(m, n)
        if self.repacked_function(kind, packed.data_ptr(), row_bytes, n, k, x.data_ptr(), m,
                                  out.data_ptr(), n, None, torch.get_num_threads()):
            raise RuntimeError("the baseline's repacked kernel failed")
        return out

    def linear(self, x: torch.Tensor, qweight: torch.Tensor, kind: int) -> torch.Tensor:
        """``x @ W.T`` as that revision's op computed it (fp32, 2-D ``x``)."""
        if self.rows[kind] is not None and x.shape[0] >= self.rows[kind]:
            return c_kernels.AVX2.linear_tiled(x, qweight, kind)
        return self.integer(x, qweight, kind, self.bits[kind])

    def integer(self, x: torch.Tensor, qweight: torch.Tensor, kind: int, bits: int
                ) -> torch.Tensor:
        """``x @ W.T`` by that revision's integer kernel with ``bits``-bit activations."""
        (m, k), (n, row_bytes) = x.shape, qweight.shape
        out = torch.empty(m, n)
        status = self.function(kind, qweight.data_ptr(), row_bytes, n, k, x.data_ptr(), m,
                               out.data_ptr(), n, None, bits, torch.get_num_threads())
        if status:
            raise RuntimeError(f"the baseline kernel returned {status}")
        return out


def row(kind: GGMLQuantizationType, shape: tuple[str, int, int], tokens: int, copies: int,
        cycle_mb: float, repeat: int, timed: tuple[str, ...], baseline: Baseline | None,
        timer: Callable[[], float] = timeit.default_timer) -> str:
    """One shape at one token count: every column's time (and rate) and the ratios."""
    name, k, n = shape
    label = f"{name:<8}{k:>6}->{n:<7}{tokens:>4}"
    if k % ggml_block(kind):
        return f"{label}  n/a: {kind.name} needs inputs in multiples of {ggml_block(kind)}"
    generator = torch.Generator().manual_seed(0)
    first = ggml_weight(generator, kind, n, k)
    copies = max(copies, math.ceil(cycle_mb * 2**20 / first.numel()))
    qweights = [first, *(first.clone() for _ in range(copies - 1))]
    dense = []
    if {"fp32", "F.linear"} & set(timed):  # fp32 copies: 4 - 8 times the bytes, fewer
        dense = [dequantize(first, kind)]
        dense += [dense[0].clone() for _ in range(math.ceil(copies / 8) - 1)]
    x = torch.randn(tokens, k, generator=generator)
    best = (c_kernels.VNNI if "ggml_vnni" == kernels.explain(
        "ggml_linear", hwplug.current_platform(), "cpu", "float32").chosen.name
        else c_kernels.AVX2)
    wide = int(kind) in c_kernels.WIDE_TYPES
    repackable = best is c_kernels.VNNI and int(kind) in c_kernels.REPACKED_TYPES
    packed = [best.repack(q, kind) for q in qweights] if repackable and "repacked" in timed \
        else []
    base_packed = [baseline.repack(q, kind) for q in qweights] \
        if baseline is not None and "base rep" in timed else []
    columns: dict[str, Callable[[], object]] = {  # the order of COLUMNS
        "ggml": lambda: [ggml_linear(x, q, kind) for q in qweights],
        "base": lambda: [baseline.linear(x, q, kind) for q in qweights],
        "avx2": lambda: [c_kernels.AVX2.linear(x, q, kind) for q in qweights],
        "int16": lambda: [best.linear_blocks(x, q, kind, None, "int16") for q in qweights],
        "int8": lambda: [best.linear_blocks(x, q, kind, None, "int8") for q in qweights],
        "base int8": lambda: [baseline.integer(x, q, kind, 8) for q in qweights],
        "repacked": lambda: [best.linear_repacked(x, q, kind) for q in packed],
        "base rep": lambda: [baseline.linear_repacked(x, q, kind) for q in base_packed],
        "tiles": lambda: [best.linear_tiled(x, q, kind) for q in qweights],
        "portable": lambda: [c_kernels.PORTABLE.linear(x, q, kind) for q in qweights],
        "fp32": lambda: [ops.linear(x, w) for w in dense],
        "F.linear": lambda: [F.linear(x, w) for w in dense],
        "reference": lambda: [ggml_linear.reference(x, q, kind) for q in qweights[:2]],
    }
    served = {c for c in timed if c not in RATES
              and (c not in ("base", "base int8")
                   or (baseline is not None and baseline.serves(kind)))
              and (c != "int16" or wide) and (c != "repacked" or repackable)
              and (c != "base rep" or (bool(base_packed) and None not in base_packed))}
    times = interleaved_us({c: columns[c] for c in COLUMNS if c in served},
                           {c: 2 if c == "reference" else len(dense) if c in ("fp32", "F.linear")
                            else copies for c in served}, repeat, timer)
    for rate, source in RATES.items():
        if source in times:
            times[rate] = first.numel() / times[source] / 1e3  # bytes per µs -> GB/s
    cells = "".join(f"{times[c]:>10.{1 if c in RATES else 0}f}" if c in times
                    else f"{'n/a':>10}" for c in timed)
    ratios = "".join(f"{times[c] / times['ggml']:>9.2f}x" if c in times and "ggml" in times
                     else f"{'n/a':>10}" for c in ("base", "fp32", "reference", "repacked"))
    for base, this, width in (("base rep", "repacked", 11), ("base int8", "int8", 10)):
        if base in timed:
            ratios += (f"{times[base] / times[this]:>{width - 1}.2f}x"
                       if base in times and this in times else f"{'n/a':>{width}}")
    return f"{label}{cells}{ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_0,Q4_1,Q8_0,Q4_K,Q6_K")
    parser.add_argument("--tokens", default="1,8,32")
    parser.add_argument("--shapes", help="NxK (output rows x inputs), comma-separated; "
                                         "default: SmolLM2-135M's")
    parser.add_argument("--layers", type=int, default=30, help="copies of each weight, "
                                                               "at least")
    parser.add_argument("--cycle-mb", type=float, default=256.0,
                        help="copies enough to fill this many MiB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch (and kernel) threads; default: "
                                                    "torch's")
    parser.add_argument("--baseline", default="main",
                        help="the git revision whose C kernel is the base column")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by the process's CPU time (time.process_time: all its "
                             "threads) rather than wall time, on a machine others load")
    parser.add_argument("--no-lm-head", action="store_true", help="skip the Q8_0 LM head")
    parser.add_argument("--columns", default=",".join(COLUMNS),
                        help=f"the columns shown, of {','.join(COLUMNS)}")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    platform = hwplug.current_platform()
    for build in (c_kernels.AVX2, c_kernels.PORTABLE):  # the columns call them directly
        build.ensure_built()
    if "avx512_vnni" in platform.facts.features:
        c_kernels.VNNI.ensure_built()
    timed = tuple(c for c in COLUMNS if c in args.columns.split(","))
    chosen = kernels.explain("ggml_linear", platform, "cpu", "float32").chosen.name
    baseline = (Baseline(args.baseline, BUILD_OF[chosen])
                if {"base", "base rep", "base int8"} & set(timed)
                else None)
    print(f"CPU: {platform.facts.device_name} ({host.machine()}, features: "
          f"{' '.join(sorted(platform.facts.features))}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; at least {args.layers} copies of each weight "
          f"and {args.cycle_mb:.0f} MiB cycled; {'CPU' if args.cpu_time else 'wall'} time")
    switch = {GGMLQuantizationType(kind).name: rows for kind, rows in
              c_kernels.tiled_from(torch.get_num_threads()).items()}
    activations = {GGMLQuantizationType(kind).name: bits for kind, bits in
                   c_kernels.activations_of(torch.get_num_threads()).items()}
    print(f"ggml_linear here: {chosen}, tiles from (rows): {switch}, activations: "
          f"{activations}; linear fp32 here: "
          f"{kernels.explain('linear', platform, 'cpu', 'float32').chosen.name}")
    tokens = [int(t) for t in args.tokens.split(",")]
    shapes = SHAPES if not args.shapes else tuple(
        (spec, int(spec.split("x")[1]), int(spec.split("x")[0]))
        for spec in args.shapes.split(","))
    header = f"{'shape':<21}{'tok':>5}" + "".join(f"{c:>10}" for c in timed)
    tables = [(kind, shapes, args.layers) for kind in
              (GGMLQuantizationType[name] for name in args.types.split(","))]
    if not args.no_lm_head:
        tables.append((GGMLQuantizationType.Q8_0, (HEAD,), 1))
    if baseline is not None:
        print(f"base: the C kernel of {args.baseline}")
    for kind, table_shapes, copies in tables:
        print(f"\n{kind.name}, microseconds per call{'' if copies > 1 else ' (LM head)'}:")
        print(f"{header}{'base/ggml':>10}{'fp32/ggml':>10}{'ref/ggml':>10}{'rep/ggml':>10}"
              + f"{'brep/rep':>11}" * ("base rep" in timed)
              + f"{'b8/int8':>10}" * ("base int8" in timed))
        for shape in table_shapes:
            for count in tokens:
                print(row(kind, shape, count, copies, args.cycle_mb, args.repeat, timed,
                          baseline, TIMER["cpu" if args.cpu_time else "wall"]), flush=True)


if __name__ == "__main__":
    main()
