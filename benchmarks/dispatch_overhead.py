"""Cost of calling an op through the kernel registry vs calling its chosen variant directly.

Three ways, timed side by side in one process on a tiny tensor, so the differences are
the dispatch itself: the chosen variant's function directly; the op bound in a kernel plan
(what a model's layers call: the dtype guard and the token-bucket bisect); and the free op
(``hwplug.ops.<op>``: its key and cached lookup, then the bound op). Goal: under 1
microsecond added per call.

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
    print(f"{'op':<14} {'variant':<10} {'direct us':>10} {'bound us':>9} {'free op us':>11} "
          f"{'added (bound, free)':>20}")
    plan = kernels.default_plan()
    for op_name, op_args in cases.items():
        op, bound = kernels.op(op_name), plan.bind(op_name, dtype_name(x.dtype))
        chosen = bound.buckets[0].chain[0]
        op(*op_args)  # bind the free op's key
        bound(*op_args)  # the bucket's first call
        direct = per_call_us(chosen.impl, op_args, args.number, args.repeat)
        through_plan = per_call_us(bound, op_args, args.number, args.repeat)
        free = per_call_us(op, op_args, args.number, args.repeat)
        print(f"{op_name:<14} {chosen.name:<10} {direct:>10.2f} {through_plan:>9.2f} "
              f"{free:>11.2f} {through_plan - direct:>9.2f}, {free - direct:>8.2f}")


if __name__ == "__main__":
    main()
