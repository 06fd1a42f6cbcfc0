"""hwplug-tpu on JAX's CPU backend: steady-state decode with one compiled step per batch
bucket, against the per-op bridge and the cpu platform.

A figure to watch, not a goal: JAX's CPU backend is not a TPU. Each side is a child
process, since a platform is chosen once per process and applies its own process
environment before torch loads:

- ``tpu step``: ``JAX_PLATFORMS=cpu HWPLUG_PLATFORM=tpu`` (on JAX's second CPU device,
  see ``_TPU``), weights and KV caches resident on the JAX device, each decode step one
  compiled XLA program per batch bucket and each prefill step one per (tokens, sequences)
  bucket, both sampling on the device;
- ``tpu per-op``: the same with ``step_graphs=False``: every op a jitted JAX call with its
  activations crossing to and from JAX, as the previous bridge ran every step;
- ``cpu``: ``HWPLUG_PLATFORM=cpu`` (its own step graphs of native calls).

Children alternate between the sides ``--repeats`` times and the median is kept, so load
from other processes hits all alike. In a child, SmolLM2 (float32 everywhere) generates
greedily from random prompts, ignoring EOS; a warm-up call of the same length first
compiles every shape bucket the timed calls meet. Decode tokens/s is
``batch * (N - 1) / (T(N) - T(1))`` with ``T(n)`` the wall time of a generate call for
``n`` new tokens, so prefill is excluded. The tpu sides also report the XLA compilations of
their warm-up and of their timed calls (0 when no step recompiles), the tpu step side
how many whole steps were compiled (one per decode batch bucket and per prefill (tokens,
sequences) bucket met), and both what crossed between the host and the JAX device per
step of a timed call (arrays and bytes each way, from ``hwplug_tpu.bridge.TRANSFERS``).

    python benchmarks/tpu_jax_cpu.py
    python benchmarks/tpu_jax_cpu.py --batch-sizes 1 8 --new-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

#: The tpu sides compute on JAX's second CPU device, apart from the host memory torch's
#: tensors live in (as the plugin's tests do), so what a step moves is a real transfer,
#: as on a TPU, and is counted.
_TPU = {"HWPLUG_PLATFORM": "tpu", "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
#: Each side's environment (on top of this process's, without these variables) and whether
#: its decode steps replay recorded steps.
SIDES = {"tpu step": (_TPU, True), "tpu per-op": (_TPU, False),
         "cpu": ({"HWPLUG_PLATFORM": "cpu"}, True)}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=32, help="N new tokens per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=16, help="tokens per prompt")
    parser.add_argument("--repeats", type=int, default=2, help="child processes per side")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-step-graphs", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what Python knows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(args: argparse.Namespace) -> dict[str, object]:
    """In a child: decode tokens/s per batch size on the resolved platform."""
    import hwplug

    hwplug.current_platform().apply_process_env()
    import torch

    llm = hwplug.LLM(args.model, dtype="float32", max_num_seqs=max(args.batch_sizes),
                     dequantize=True, step_graphs=not args.no_step_graphs,
                     max_model_len=args.prompt_tokens + args.new_tokens)
    counter, recorder, transfers = None, None, None
    if llm.platform == "tpu":
        from hwplug_tpu.bridge import TRANSFERS
        from hwplug_tpu.compilations import compilations
        from hwplug_tpu.step import RECORDER

        counter, recorder, transfers = compilations(), RECORDER, TRANSFERS
    generator = torch.Generator().manual_seed(0)
    rates, compiled, crossed = {}, {"warm-up": 0, "timed": 0}, {}
    for batch in args.batch_sizes:
        prompts = torch.randint(0, llm.hf_config.vocab_size, (batch, args.prompt_tokens),
                                generator=generator).tolist()

        def seconds(new_tokens: int, prompts: list[list[int]] = prompts) -> float:
            start = time.perf_counter()
            llm.generate(prompts, hwplug.SamplingParams(max_tokens=new_tokens, ignore_eos=True))
            return time.perf_counter() - start

        before = counter.count if counter else 0
        seconds(args.new_tokens)
        warm = counter.count if counter else 0
        if transfers:
            transfers.reset()
        full = seconds(args.new_tokens)
        if transfers:  # per step of the timed call (its prefill step and decode steps)
            crossed[str(batch)] = [round(n / args.new_tokens) for n in (
                transfers.to_device, transfers.to_device_bytes, transfers.to_host,
                transfers.to_host_bytes)]
        prefill = seconds(1)
        compiled["warm-up"] += warm - before
        compiled["timed"] += (counter.count if counter else 0) - warm
        rates[str(batch)] = batch * (args.new_tokens - 1) / (full - prefill)
    graphs, prefill_graphs = llm.runner.graphs, llm.runner.prefill_graphs
    return {"rates": rates, "compilations": compiled, "threads": torch.get_num_threads(),
            "steps": len(recorder.compiled) if recorder else 0,
            "buckets": graphs.recorded if graphs else [],
            "prefill_buckets": prefill_graphs.recorded if prefill_graphs else [],
            "crossed": crossed}


def run_side(side: str, args: argparse.Namespace) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HWPLUG_PLATFORM", "JAX_PLATFORMS", "OMP_WAIT_POLICY",
                         "GOMP_SPINCOUNT", "XLA_FLAGS")}
    side_env, step_graphs = SIDES[side]
    command = [sys.executable, __file__, "--child", "--new-tokens", str(args.new_tokens),
               "--prompt-tokens", str(args.prompt_tokens), "--batch-sizes",
               *map(str, args.batch_sizes), *(["--model", args.model] if args.model else []),
               *([] if step_graphs else ["--no-step-graphs"])]
    result = subprocess.run(command, env={**env, **side_env}, capture_output=True, text=True,
                            check=False)
    if result.returncode:
        sys.exit(f"the {side} child failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    runs: dict[str, list[dict[str, object]]] = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        for side in (SIDES if repeat % 2 == 0 else reversed(SIDES)):
            runs[side].append(run_side(side, args))
    print(f"CPU {cpu_model()} ({os.cpu_count()} logical CPUs), {runs['cpu'][0]['threads']} "
          f"torch threads; SmolLM2 float32, {args.new_tokens} new tokens after "
          f"{args.prompt_tokens}-token prompts; decode tokens/s, median of {args.repeats} "
          "processes per side")
    for side in ("tpu step", "tpu per-op"):
        last = runs[side][-1]
        compiled = last["compilations"]
        steps = (f" ({last['steps']} whole steps: decode batch buckets "
                 f"{', '.join(map(str, last['buckets']))}; prefill (tokens, sequences) "
                 f"buckets {', '.join(str(tuple(b)) for b in last['prefill_buckets'])})"
                 if last["steps"] else "")
        print(f"{side}: XLA compilations per process: {compiled['warm-up']} in the warm-up"
              f"{steps}, {compiled['timed']} in the timed calls")
        for batch, (sent, sent_bytes, back, back_bytes) in last["crossed"].items():
            print(f"{side}: per step at batch {batch}: {sent} arrays ({sent_bytes} bytes) to "
                  f"the device, {back} ({back_bytes} bytes) back")
    print(f"{'batch':>5} {'tpu step':>9} {'tpu per-op':>11} {'step/per-op':>12} {'cpu':>8} "
          f"{'step/cpu':>9}")
    for batch in map(str, args.batch_sizes):
        step, per_op, cpu = (statistics.median(run["rates"][batch] for run in runs[side])
                             for side in SIDES)
        print(f"{batch:>5} {step:>9.1f} {per_op:>11.1f} {step / per_op:>11.2f}x {cpu:>8.1f} "
              f"{step / cpu:>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
