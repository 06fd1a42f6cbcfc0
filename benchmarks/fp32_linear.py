"""``linear`` on fp32 weights on this CPU: hwplug's choice vs oneDNN and plain ``F.linear``.

SmolLM2-135M's decoder GEMMs (benchmarks/ggml_linear.py's ``SHAPES``) and its LM head at
``--tokens`` activation rows (decode batches; a prefill's hundreds), each call reading the
next of ``--layers`` copies of the weight (two of the head's), so the weights come from
memory as in a decode step. Columns, microseconds per call: ``hwplug`` (the ``linear`` op
as dispatched here: on AVX2 CPUs ``gemv_avx2`` for one row and ``gemm_avx2`` from two,
else ``onednn_packed``), ``oneDNN`` (the ``onednn_packed`` variant itself) and
``F.linear``; then GB/s of weight read by hwplug, and ratios: each column's time over
hwplug's (above 1: hwplug is faster). The CPU is named as the probe reads it.

    python benchmarks/fp32_linear.py [--tokens 1,2,8,32] [--layers 30] [--repeat 5]
"""

from __future__ import annotations

import argparse

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ggml_linear import HEAD, SHAPES, interleaved_us  # noqa: E402

from hwplug import kernels, ops  # noqa: E402


def row(shape: tuple[str, int, int], tokens: int, copies: int, repeat: int) -> str:
    name, k, n = shape
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=generator) / k**0.5 for _ in range(copies)]
    x = torch.randn(tokens, k, generator=generator)
    onednn = kernels.get("linear/onednn_packed")
    onednn.load()
    times = interleaved_us({
        "hwplug": lambda: [ops.linear(x, w) for w in weights],
        "oneDNN": lambda: [onednn.impl(x, w) for w in weights],
        "F.linear": lambda: [F.linear(x, w) for w in weights],
    }, copies, repeat)
    cells = "".join(f"{t:>10.0f}" for t in times.values())
    bandwidth = n * k * 4 / times["hwplug"] / 1e3
    ratios = "".join(f"{times[c] / times['hwplug']:>11.2f}x" for c in ("oneDNN", "F.linear"))
    return f"{name:<8}{k:>5}->{n:<6}{tokens:>4}{cells}{bandwidth:>8.1f}{ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,2,8,32")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    platform = hwplug.current_platform()
    chosen = {kernels.explain("linear", platform, "cpu", "float32", rows).chosen.name
              for rows in (1, 2)}
    print(f"CPU: {platform.facts.device_name} (features: "
          f"{' '.join(sorted(platform.facts.features))}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; linear for 1 and 2 fp32 rows here: "
          f"{' and '.join(sorted(chosen))}; "
          f"weights of {args.layers} layers cycled (the head's: 2)")
    print(f"{'shape':<19}{'tok':>5}{'hwplug':>10}{'oneDNN':>10}{'F.linear':>10}{'GB/s':>8}"
          f"{'oneDNN/hw':>12}{'F.lin/hw':>12}")
    for shape in (*SHAPES, HEAD):
        copies = 2 if shape == HEAD else args.layers
        for tokens in (int(t) for t in args.tokens.split(",")):
            print(row(shape, tokens, copies, args.repeat), flush=True)


if __name__ == "__main__":
    main()
