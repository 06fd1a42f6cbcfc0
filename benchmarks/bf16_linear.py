"""``linear`` on bf16 weights on this CPU: hwplug's choice vs torch's bf16 GEMM and fp32.

SmolLM2-135M's decoder GEMMs (benchmarks/ggml_linear.py's ``SHAPES``) at 1, 8, 16 and 32
tokens, each call reading the next of ``--layers`` copies of the weight. Columns,
microseconds per call: ``hwplug`` (the ``linear`` op for bf16 as dispatched here: on a CPU
without bf16 arithmetic the ``bf16_storage`` variant), ``torch_bf16`` (``F.linear`` in
bf16, what the reference does) and ``fp32`` (the op on fp32 copies of the weights: the
dtype bf16 storage competes with). Ratios: each column's time over hwplug's (above 1:
hwplug is faster). The CPU is named as the probe reads it.

    python benchmarks/bf16_linear.py [--tokens 1,8,16,32] [--layers 30] [--repeat 5]
"""

from __future__ import annotations

import argparse

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from ggml_linear import SHAPES, interleaved_us  # noqa: E402

from hwplug import kernels, ops  # noqa: E402


def row(shape: tuple[str, int, int], tokens: int, copies: int, repeat: int) -> str:
    name, k, n = shape
    generator = torch.Generator().manual_seed(0)
    dense = [torch.randn(n, k, generator=generator) / k**0.5 for _ in range(copies)]
    bf16 = [w.bfloat16() for w in dense]
    x = torch.randn(tokens, k, generator=generator)
    x16 = x.bfloat16()
    times = interleaved_us({
        "hwplug": lambda: [ops.linear(x16, w) for w in bf16],
        "torch_bf16": lambda: [F.linear(x16, w) for w in bf16],
        "fp32": lambda: [ops.linear(x, w) for w in dense],
    }, copies, repeat)
    cells = "".join(f"{t:>12.0f}" for t in times.values())
    ratios = "".join(f"{times[c] / times['hwplug']:>11.2f}x" for c in ("torch_bf16", "fp32"))
    return f"{name:<8}{k:>5}->{n:<6}{tokens:>4}{cells}{ratios}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="1,8,16,32")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    platform = hwplug.current_platform()
    chosen = {dtype: kernels.explain("linear", platform, "cpu", dtype).chosen.name
              for dtype in ("bfloat16", "float32")}
    print(f"CPU: {platform.facts.device_name} (features: "
          f"{' '.join(sorted(platform.facts.features))}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; linear here: bf16 -> {chosen['bfloat16']}, "
          f"fp32 -> {chosen['float32']}; weights of {args.layers} layers cycled")
    print(f"{'shape':<19}{'tok':>5}{'hwplug':>12}{'torch_bf16':>12}{'fp32':>12}"
          f"{'bf16/hwplug':>12}{'fp32/hwplug':>12}")
    for shape in SHAPES:
        for tokens in (int(t) for t in args.tokens.split(",")):
            print(row(shape, tokens, args.layers, args.repeat), flush=True)


if __name__ == "__main__":
    main()
