"""Decode cost in CPU time, hwplug beside llama.cpp on one GGUF: a measure that a loaded
machine disturbs less than tokens/s.

On a machine other processes share, wall-clock tokens/s say how much of the cores an
engine got more than what it costs. This runs each engine (``benchmarks/peers/``'s
``hwplug`` runner with the GGUF's blocks kept, and ``llamacpp``, llama-cpp-python on the
file) in a fresh process of its own and measures the CPU time of the process
(``time.process_time``: every thread of it, so on ``--threads 1`` one core's work) of one
``generate`` call of ``B`` prompts of ``--prompt-tokens`` random token ids with 1 new token
and of one with ``1 + --new-tokens``; their difference over ``--new-tokens`` is the CPU time
of one decode step of ``B`` sequences (prefill and the first token taken out). The lower of
``--repeats`` pairs counts (after a warm-up call per batch size); wall time per step is
printed beside it. Memory bandwidth and caches are still shared with the other processes:
the numbers stay noisy on a loaded machine (the load average is printed), less so than
tokens/s. With ``--threads`` above 1, idle OpenMP workers' spinning counts as CPU time too.

Made for the mixture-of-experts GGUFs of ``benchmarks/make_gguf.py`` (issue 26: a 2-layer
Qwen3-30B-A3B-shaped model, decode at batch 1 and 8 beside llama.cpp); any GGUF both
engines load works.

    python benchmarks/decode_cpu_time.py --model /work/models/qwen3-30b-a3b-2l-random-Q4_K_M.gguf
    python benchmarks/decode_cpu_time.py --model M --batch-sizes 1 8 --threads 1 --new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

PEERS = Path(__file__).resolve().parent / "peers"
ENGINES = ("hwplug", "llamacpp")
#: Printed by the child before its JSON result.
MARKER = "DECODE_CPU_TIME "


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """In the child: ``{batch: [CPU ms, wall ms]}`` per decode step of ``args.engine``."""
    sys.path.insert(0, str(PEERS))
    max_batch = max(args.batch_sizes)
    if args.engine == "hwplug":
        from hwplug_runner import HwplugEngine

        kv = max_batch * (args.prompt_tokens + args.new_tokens + 16) + 64
        engine = HwplugEngine({"model": str(args.model), "dtype": "float32",
                               "dequantize": False, "kv_tokens": kv}, args.threads, max_batch)
    else:
        from llamacpp_runner import LlamaCppEngine

        engine = LlamaCppEngine({"path": str(args.model)}, args.threads, max_batch)
    rng = random.Random(0)
    results = {}
    for batch in args.batch_sizes:
        def prompts(b: int = batch) -> list[list[int]]:
            return [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)]
                    for _ in range(b)]

        engine.generate(prompts(), args.new_tokens + 1)  # warm-up
        pairs = []
        for _ in range(args.repeats):
            costs = []
            for new in (1, args.new_tokens + 1):
                cpu, wall = time.process_time(), time.perf_counter()
                engine.generate(prompts(), new)
                costs.append((time.process_time() - cpu, time.perf_counter() - wall))
            pairs.append(tuple((costs[1][i] - costs[0][i]) / args.new_tokens * 1e3
                               for i in range(2)))
        results[str(batch)] = list(min(pairs))
    return results


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if not args.model.is_file():
        parser.error(f"--model {args.model}: no such file")
    if min(args.batch_sizes) < 1 or args.new_tokens < 1 or args.repeats < 1:
        parser.error("--batch-sizes, --new-tokens and --repeats must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    if args.engine:
        print(MARKER + json.dumps(measure(args)), flush=True)
        return 0
    print(f"{args.model.name}: {args.prompt_tokens}-token prompts, {args.new_tokens} decode "
          f"steps, {args.threads} thread(s); load average {os.getloadavg()[0]:.2f} at start")
    results = {}
    for engine in args.engines:
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--engine", engine],
            env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, text=True,
            capture_output=True, check=False)
        lines = [line for line in child.stdout.splitlines() if line.startswith(MARKER)]
        if child.returncode or not lines:
            print(f"{engine}: failed (exit status {child.returncode}):\n"
                  + "\n".join(child.stderr.splitlines()[-10:]))
            return 1
        results[engine] = json.loads(lines[-1][len(MARKER):])
    print(f"{'engine':<10}" + "".join(f"{f'batch {b} CPU ms':>17}{'wall ms':>9}{'tok/CPU s':>11}"
                                       for b in args.batch_sizes))
    for engine, per_batch in results.items():
        print(f"{engine:<10}" + "".join(
            f"{per_batch[str(b)][0]:>17.1f}{per_batch[str(b)][1]:>9.1f}"
            f"{b * 1e3 / per_batch[str(b)][0]:>11.1f}" for b in args.batch_sizes))
    if len(results) == 2:
        print("hwplug / llama.cpp, CPU time per step (above 1: hwplug cheaper): " + ", ".join(
            f"batch {b} {results['llamacpp'][str(b)][0] / results['hwplug'][str(b)][0]:.2f}x"
            for b in args.batch_sizes))
    print(f"load average {os.getloadavg()[0]:.2f} at the end (noisy where it is above 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
