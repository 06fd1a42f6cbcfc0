"""``ggml_linear`` on GGUF blocks vs fp32 GEMMs and the op's reference, side by side.

SmolLM2-135M's four GEMMs per decoder layer (fused q/k/v 576 -> 960, o 576 -> 576, fused
gate/up 576 -> 3072, down 1536 -> 576) and its tied LM head (576 -> 49152, Q8_0 in the
shipped GGUF), at 1, 8 and 32 tokens, for each GGUF type (K-quants need inputs in
multiples of 256, so of SmolLM2's shapes only 1536 -> 576 takes them). Like a decode
step, each call reads the next of ``--layers`` copies of the weight (30: SmolLM2's
layers), so the weights come from memory, not from a cache that holds one layer.

Columns, microseconds per call: ``ggml`` (the op as dispatched here: the cpu platform's
C variant, which takes the integer kernel below the tuned number of rows and dequantized
tiles from there on), ``int16`` and ``int8`` (the integer kernel with each activation
type) and ``tiles`` (each path alone), ``portable`` (the
build for CPUs without AVX2), ``fp32`` (the ``linear`` op on the dequantized weight as
dispatched here, on AVX2 CPUs ``gemv_avx2`` at one row and ``gemm_avx2`` from two, else
oneDNN: the baseline) and
plain ``F.linear``, and the op's ``reference`` (dequantize,
then ``F.linear``). Ratios: the baseline's time over ``ggml``'s (above 1: ggml is
faster) and the reference's over ``ggml``'s. The CPU is named as the probe reads it
(lscpu's ``Model name``).

    python benchmarks/ggml_linear.py [--types Q4_0,Q4_1,Q8_0,Q4_K,Q6_K] [--tokens 1,8,32]
                                     [--layers 30] [--repeat 5] [--threads N]
                                     [--columns ggml,int16,int8,tiles,fp32]

``--columns`` times only those (the ratios need ``ggml``, ``fp32`` and ``reference``:
a ratio whose columns are left out shows as n/a).
"""

from __future__ import annotations

import argparse
import platform as host
import timeit
from collections.abc import Callable

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402

from hwplug import kernels, ops  # noqa: E402
from hwplug.kernel_registry.ops_ggml import ggml_linear  # noqa: E402
from hwplug.kernel_registry.reference.ggml import dequantize  # noqa: E402
from hwplug.kernel_registry.reference.ggml_weights import ggml_block, ggml_weight  # noqa: E402
from hwplug.platforms.cpu.ggml import ops as c_kernels  # noqa: E402

#: (name, input, output) of SmolLM2-135M's GEMMs per decoder layer.
SHAPES = (("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576))
#: Its tied LM head: one copy, as the GGUF stores it.
HEAD = ("lm_head", 576, 49152)
COLUMNS = ("ggml", "int16", "int8", "tiles", "portable", "fp32", "F.linear", "reference")
#: Seconds of calls each timing aims at (at least one call).
BUDGET_S = 0.05


def interleaved_us(columns: dict[str, Callable[[], object]], calls_per_run: int,
                   repeat: int) -> dict[str, float]:
    """Each column's best time of one of the ``calls_per_run`` calls its function makes,
    the columns timed in turn in each of ``repeat`` rounds (so all see the same machine)."""
    numbers = {}
    for column, fn in columns.items():
        start = timeit.default_timer()
        fn()  # first run: dispatch, packing, caches warm
        numbers[column] = max(1, int(BUDGET_S / max(timeit.default_timer() - start, 1e-6)))
    best = dict.fromkeys(columns, float("inf"))
    for _ in range(repeat):
        for column, fn in columns.items():
            seconds = timeit.timeit(fn, number=numbers[column]) / numbers[column]
            best[column] = min(best[column], seconds / calls_per_run * 1e6)
    return best


def row(kind: GGMLQuantizationType, shape: tuple[str, int, int], tokens: int, copies: int,
        repeat: int, timed: tuple[str, ...] = COLUMNS) -> str:
    """One shape at one token count: every column's time and the two ratios."""
    name, k, n = shape
    label = f"{name:<8}{k:>5}->{n:<6}{tokens:>4}"
    if k % ggml_block(kind):
        return f"{label}  n/a: {kind.name} needs inputs in multiples of {ggml_block(kind)}"
    generator = torch.Generator().manual_seed(0)
    qweights = [ggml_weight(generator, kind, n, k) for _ in range(copies)]
    dense = [dequantize(q, kind) for q in qweights]
    x = torch.randn(tokens, k, generator=generator)
    columns: dict[str, Callable[[], object]] = {  # the order of COLUMNS
        "ggml": lambda: [ggml_linear(x, q, kind) for q in qweights],
        "int16": lambda: [c_kernels.AVX2.linear_blocks(x, q, kind, None, "int16")
                          for q in qweights],
        "int8": lambda: [c_kernels.AVX2.linear_blocks(x, q, kind, None, "int8")
                         for q in qweights],
        "tiles": lambda: [c_kernels.AVX2.linear_tiled(x, q, kind) for q in qweights],
        "portable": lambda: [c_kernels.PORTABLE.linear(x, q, kind) for q in qweights],
        "fp32": lambda: [ops.linear(x, w) for w in dense],
        "F.linear": lambda: [F.linear(x, w) for w in dense],
        "reference": lambda: [ggml_linear.reference(x, q, kind) for q in qweights],
    }
    times = interleaved_us({c: columns[c] for c in timed}, copies, repeat)
    cells = "".join(f"{times[c]:>10.0f}" for c in timed)
    ratios = "".join(f"{times[c] / times['ggml']:>9.2f}x" if c in times and "ggml" in times
                     else f"{'n/a':>10}" for c in ("fp32", "reference"))
    return f"{label}{cells}{ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_0,Q4_1,Q8_0,Q4_K,Q6_K")
    parser.add_argument("--tokens", default="1,8,32")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, help="torch (and kernel) threads; default: "
                                                    "torch's")
    parser.add_argument("--columns", default=",".join(COLUMNS),
                        help=f"the columns timed, of {','.join(COLUMNS)}")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    platform = hwplug.current_platform()
    for build in (c_kernels.AVX2, c_kernels.PORTABLE):  # the columns call them directly
        build.ensure_built()
    print(f"CPU: {platform.facts.device_name} ({host.machine()}, features: "
          f"{' '.join(sorted(platform.facts.features))}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; weights of {args.layers} layers cycled")
    chosen = kernels.explain("ggml_linear", platform, "cpu", "float32").chosen.name
    switch = {GGMLQuantizationType(kind).name: rows for kind, rows in
              c_kernels.tiled_from(torch.get_num_threads()).items()}
    activations = {GGMLQuantizationType(kind).name: bits for kind, bits in
                   c_kernels.activations_of(torch.get_num_threads()).items()}
    print(f"ggml_linear here: {chosen}, tiles from (rows): {switch}, activations: "
          f"{activations}; linear fp32 here: "
          f"{kernels.explain('linear', platform, 'cpu', 'float32').chosen.name}")
    tokens = [int(t) for t in args.tokens.split(",")]
    timed = tuple(c for c in COLUMNS if c in args.columns.split(","))
    header = f"{'shape':<19}{'tok':>5}" + "".join(f"{c:>10}" for c in timed)
    tables = [(kind, SHAPES, args.layers) for kind in
              (GGMLQuantizationType[name] for name in args.types.split(","))]
    for kind, shapes, copies in [*tables, (GGMLQuantizationType.Q8_0, (HEAD,), 1)]:
        print(f"\n{kind.name}, microseconds per call{'' if copies > 1 else ' (LM head)'}:")
        print(f"{header}{'fp32/ggml':>12}{'ref/ggml':>9}")
        for shape in shapes:
            for count in tokens:
                print(row(kind, shape, count, copies, args.repeat, timed), flush=True)


if __name__ == "__main__":
    main()
