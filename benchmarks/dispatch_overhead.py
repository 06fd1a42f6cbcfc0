"""Cost of calling an op through the kernel registry vs calling its chosen variant directly.

Both are timed side by side in one process on a tiny tensor, so the difference is the
dispatch itself (key build + cached lookup). Goal: under 1 microsecond added per call.

    python benchmarks/dispatch_overhead.py
"""

from __future__ import annotations

import argparse
import timeit

import torch

from hwplug import current_platform
from hwplug.dtypes import dtype_name
from hwplug.kernel_registry import kernels


def per_call_us(fn, args: tuple, number: int, repeat: int) -> float:
    """Best-of-``repeat`` mean time of one call, in microseconds."""
    return min(timeit.repeat(lambda: fn(*args), number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    x = torch.randn(1, 8)
    weight = torch.ones(8)
    cases = {
        "silu_and_mul": (x,),
        "rms_norm": (x, weight, 1e-6),
    }
    platform = current_platform()
    print(f"platform {platform.name}, torch {torch.__version__}, tensor {tuple(x.shape)}")
    print(f"{'op':<14} {'variant':<10} {'direct us':>10} {'registry us':>12} {'added us':>9}")
    for op_name, op_args in cases.items():
        op = kernels.op(op_name)
        chosen = kernels.explain(op_name, platform, x.device.type, dtype_name(x.dtype)).chosen
        op(*op_args)  # resolve and cache the choice
        direct = per_call_us(chosen.impl, op_args, args.number, args.repeat)
        through = per_call_us(op, op_args, args.number, args.repeat)
        print(f"{op_name:<14} {chosen.name:<10} {direct:>10.2f} {through:>12.2f} "
              f"{through - direct:>9.2f}")


if __name__ == "__main__":
    main()
