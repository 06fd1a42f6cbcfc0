"""The small ops of a CPU decode step: the fused C variants vs the variants they replace.

SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 query / 3 KV heads of 64, block size 16),
fp32, at 1 and 4 tokens (decode batches), and decode attention over contexts of 128 to
2048 tokens. Per op, microseconds per call, timed interleaved (so load from other
processes hits all columns alike), best of ``--repeat`` rounds: ``fused`` (the AVX2 build
of platforms/cpu/fused/kernels.c), ``portable`` (its build for other CPUs), ``before``
(the variant the registry chose before the fused kernels: torch_fused, sdpa_decode or the
reference for silu_and_mul) and the ratio before / fused (above 1: fused is faster). The
last lines time the ctypes wrapper: the C call alone on an empty input, and a whole
rms_norm call on 8 values. The CPU is named as the probe reads it.

    python benchmarks/cpu_small_ops.py [--threads N] [--repeat 7]
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable

import hwplug

hwplug.current_platform().apply_process_env()  # before torch loads, as `hwplug generate`

import torch  # noqa: E402

from hwplug import kernels, ops  # noqa: E402
from hwplug.attention import PagedAttentionParams  # noqa: E402
from hwplug.conformance.inputs import BlockLayout, PagedBatch, Step  # noqa: E402
from hwplug.platforms.cpu.fused import ops as fused  # noqa: E402

HIDDEN, MLP, HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 576, 1536, 9, 3, 64, 16
#: Seconds of calls each timing aims at.
BUDGET_S = 0.02


def best_us(columns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Each column's best microseconds per call, the columns timed in turn each round."""
    numbers = {}
    for name, fn in columns.items():
        start = timeit.default_timer()
        fn()
        numbers[name] = max(1, int(BUDGET_S / max(timeit.default_timer() - start, 1e-7)))
    best = dict.fromkeys(columns, float("inf"))
    for _ in range(repeat):
        for name, fn in columns.items():
            best[name] = min(best[name], timeit.timeit(fn, number=numbers[name]) / numbers[name])
    return {name: seconds * 1e6 for name, seconds in best.items()}


def cases(tokens: int) -> list[tuple[str, str, tuple, dict]]:
    """(op, label, args, kwargs) of each small op at ``tokens`` decode tokens."""
    generator = torch.Generator().manual_seed(tokens)
    x, residual = (torch.randn(tokens, HIDDEN, generator=generator) for _ in range(2))
    qkv = torch.randn(tokens, HEADS + 2 * KV_HEADS, HEAD_SIZE, generator=generator)
    cache = ops.build_cos_sin_cache(HEAD_SIZE, 8192, 100000.0)
    positions = torch.randint(0, 8192, (tokens,), generator=generator)
    found = [
        ("rms_norm", f"[{tokens}, {HIDDEN}]", (x, torch.randn(HIDDEN), 1e-5), {}),
        ("rms_norm", f"[{tokens}, {HIDDEN}] + res", (x, torch.randn(HIDDEN), 1e-5, residual), {}),
        ("silu_and_mul", f"[{tokens}, {2 * MLP}]",
         (torch.randn(tokens, 2 * MLP, generator=generator),), {}),
        ("rotary_embedding", f"[{tokens}, {HEADS}+{KV_HEADS}, {HEAD_SIZE}]",
         (positions, qkv[:, :HEADS], qkv[:, HEADS:HEADS + KV_HEADS], cache, True), {}),
    ]
    for context in (128, 512, 2048):
        layout = BlockLayout.shuffled(generator, [context] * tokens, BLOCK)
        batch = PagedBatch.build(layout, [Step(context - 1, 1)] * tokens)
        kv_cache = torch.randn(2, layout.num_blocks, BLOCK, KV_HEADS, HEAD_SIZE,
                               generator=generator)
        query = torch.randn(tokens, HEADS, HEAD_SIZE, generator=generator)
        found.append(("paged_attention", f"decode x{tokens}, context {context}",
                      (query, kv_cache, batch.metadata(), PagedAttentionParams(HEAD_SIZE ** -0.5)),
                      {}))
    return found


def row(op: str, label: str, call_args: tuple, kwargs: dict, repeat: int) -> str:
    """One line of the table: ``op`` on ``call_args`` by each column."""
    chain = kernels.explain(op, hwplug.current_platform(), "cpu", "float32").chain
    before = next(v for v in chain if not v.name.startswith("fused_"))  # the fused left out
    before.load()
    us = best_us({"before": lambda: before.impl(*call_args, **kwargs),
                  "fused": lambda: getattr(fused.AVX2, op)(*call_args, **kwargs),
                  "portable": lambda: getattr(fused.PORTABLE, op)(*call_args, **kwargs)}, repeat)
    return (f"{op:<17}{label:<28}{before.name:>14}{us['before']:>9.1f}{us['fused']:>9.1f}"
            f"{us['portable']:>9.1f}{us['before'] / us['fused']:>12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch (and kernel) threads")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    platform = hwplug.current_platform()
    for build in (fused.AVX2, fused.PORTABLE):  # the columns call them directly
        build.ensure_built()
    print(f"CPU: {platform.facts.device_name}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, fp32, SmolLM2-135M shapes")
    print(f"{'op':<17}{'shape':<28}{'before':>14}{'us':>9}{'fused':>9}{'portable':>9}"
          f"{'before/fused':>13}")
    for tokens in (1, 4):
        for case in cases(tokens):
            print(row(*case, args.repeat), flush=True)
    lib, tiny = fused.AVX2.library, torch.randn(1, 8)
    weight, empty = torch.ones(8), torch.empty(0, 8)
    wrapper = best_us({
        "ctypes call": lambda: lib.hwplug_rms_norm(empty.data_ptr(), 1, 8, None,
                                                   empty.data_ptr(), None, weight.data_ptr(),
                                                   0, 8, 1e-5, 1),
        "rms_norm [1, 8]": lambda: fused.AVX2.rms_norm(tiny, weight, 1e-5),
        "ops.rms_norm [1, 8]": lambda: ops.rms_norm(tiny, weight, 1e-5)}, args.repeat)
    print("wrapper overhead (us): " + ", ".join(f"{k} {v:.2f}" for k, v in wrapper.items()))


if __name__ == "__main__":
    main()
