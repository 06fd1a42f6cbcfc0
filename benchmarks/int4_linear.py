"""int4_linear variants vs dense fp32 ``F.linear`` and the op's reference, side by side.

One SmolLM2-135M decoder layer's four GEMMs (fused q/k/v 576 -> 960, o 576 -> 576, fused
gate/up 576 -> 3072, down 1536 -> 576) at 1, 8 and 32 tokens, with int4 weights in groups
of 32 inputs and with one scale per row. Each row is one way to compute them, called
directly (whatever this host's platform would choose): dense ``F.linear`` in fp32 (the
baseline, ratio 1.00x), the ``int4_linear`` reference (dequantize every call, then
``F.linear``), and every registered variant of the op in each dtype it declares, a
variant's declined shapes shown as such. Printed: microseconds per layer and the ratio
to the baseline (below 1: faster), with the CPU (the probe's name of it, as lscpu's
``Model name``), torch and whether torch has KleidiAI.

On x86 torch's ``_dyn_quant_*`` ops run a portable C++ loop, so the ``kleidiai`` rows
there measure that loop (hwplug never registers them for x86 CPUs), not KleidiAI.

    python benchmarks/int4_linear.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import platform as host
import timeit
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hwplug import current_platform, kernels
from hwplug.kernel_registry.ops_int4 import int4_linear
from hwplug.kernel_registry.reference.int4 import dequantize_int4

#: (input, output) of SmolLM2-135M's four GEMMs per decoder layer.
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))
TOKENS = (1, 8, 32)
#: name -> group size (None: one scale per row).
GROUPINGS = {"groups of 32": 32, "per row": None}
#: Seconds of calls each timing aims at (at least one call).
BUDGET_S = 0.05


def weights(group: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random int4 ``(qweight, scales)`` for each of :data:`SHAPES`."""
    generator = torch.Generator().manual_seed(0)
    made = []
    for in_features, out_features in SHAPES:
        qweight = torch.randint(0, 256, (out_features, in_features // 2), generator=generator,
                                dtype=torch.uint8)
        scales = torch.rand(out_features, in_features // (group or in_features),
                            generator=generator) * 0.01 + 0.001
        made.append((qweight, scales))
    return made


def time_us(fn: Callable[[], object], repeat: int) -> float:
    start = timeit.default_timer()
    fn()  # first call: dispatch, packing
    number = max(1, int(BUDGET_S / max(timeit.default_timer() - start, 1e-6)))
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def inputs(tokens: int, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    return {k: torch.randn(tokens, k).to(dtype) for k in {k for k, _ in SHAPES}}


def rows() -> list[tuple[str, torch.dtype, Callable[..., torch.Tensor], Callable | None]]:
    """(name, activation dtype, ``fn(x, qweight, scales)``, its ``supports`` or None) of
    every way to compute the op: the reference, then each variant in each of its dtypes."""
    found = [("int4_linear reference", torch.float32, int4_linear.reference, None)]
    for variant in kernels.variants("int4_linear"):
        if variant.name == kernels.REFERENCE:
            continue
        variant.load()
        found += [(f"int4_linear/{variant.name}", getattr(torch, dtype), variant.impl,
                   variant.supports) for dtype in variant.requirements.dtypes]
    return found


def run_layer(fn, layer, xs) -> None:
    for qweight, scales in layer:
        fn(xs[qweight.shape[1] * 2], qweight, scales)


def print_table(name: str, group: int | None, repeat: int) -> None:
    layer = weights(group)
    dense = [dequantize_int4(q, s) for q, s in layer]
    print(f"\nint4 weights, {name}")
    print(f"{'path':<34}" + "".join(f"{f'{t} tok us':>12}{'ratio':>8}" for t in TOKENS))
    baseline = {}
    cells = []
    for tokens in TOKENS:
        xs = inputs(tokens, torch.float32)
        us = time_us(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in dense], repeat)
        baseline[tokens] = us
        cells.append(f"{us:>12.0f}{1:>7.2f}x")
    print(f"{'F.linear fp32 (dense)':<34}" + "".join(cells))
    for label, dtype, fn, supports in rows():
        cells = []
        for tokens in TOKENS:
            xs = inputs(tokens, dtype)
            if supports is not None and supports(xs[576], *layer[0]):
                cells.append(f"{'declined':>20}")
                continue
            us = time_us(lambda fn=fn, xs=xs: run_layer(fn, layer, xs), repeat)
            cells.append(f"{us:>12.0f}{us / baseline[tokens]:>7.2f}x")
        dtype_name = str(dtype).removeprefix("torch.")
        print(f"{f'{label} {dtype_name}':<34}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    platform = current_platform()
    kleidiai = getattr(torch.backends, "kleidiai", None)
    has_kleidiai = bool(kleidiai and kleidiai.is_available())
    features = " ".join(sorted(platform.facts.features))
    path = "built in" if has_kleidiai else "absent: portable _dyn_quant path"
    print(f"CPU {platform.facts.device_name} ({host.machine()}), platform {platform.name} "
          f"(features: {features}), torch {torch.__version__} (KleidiAI {path}), "
          f"{torch.get_num_threads()} threads")
    for name, group in GROUPINGS.items():
        print_table(name, group, args.repeat)


if __name__ == "__main__":
    main()
