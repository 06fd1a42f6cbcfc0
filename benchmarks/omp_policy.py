"""OpenMP wait policy on this CPU: batch-1 decode tokens/s and idle CPU burn per setting.

libgomp (torch's OpenMP runtime on Linux) reads its settings once, when torch loads, so
each setting runs in a fresh child process: it builds ``hwplug.LLM()`` (the default model
or ``--model``, GGUF blocks kept; ``--dequantize`` for float weights), warms up, times batch-1 greedy
decode, then sleeps and measures how many cores the idle process keeps busy (CPU time
over wall time: OpenMP workers that spin instead of sleeping burn a core each). Settings
alternate round by round so that a change in machine load hits them all alike; the table
shows medians and each setting's decode speed relative to libgomp's default.

    python benchmarks/omp_policy.py
    python benchmarks/omp_policy.py --rounds 5 --new-tokens 64 --dequantize
    python benchmarks/omp_policy.py --model /path/to/model.gguf --settings default GOMP_SPINCOUNT=10M
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

#: The settings compared: name -> environment added to the child's (libgomp's default is
#: OMP_WAIT_POLICY unset: spin ~300k iterations, then sleep).
SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"},
    "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
    "GOMP_SPINCOUNT=10M": {"GOMP_SPINCOUNT": "10000000"},
    "GOMP_SPINCOUNT=100M": {"GOMP_SPINCOUNT": "100000000"},
}

#: The measured process: prints decode tokens/s and idle cores busy as JSON.
CHILD = """
import json, time
import hwplug
llm = hwplug.LLM({model!r}, dequantize={dequantize})
params = hwplug.SamplingParams(max_tokens={new_tokens}, ignore_eos=True)
prompt = list(range(100, 132))
llm.generate([prompt], params)  # warm-up
start = time.perf_counter()
out = llm.generate([prompt], params)[0]
decode = len(out.token_ids) / (time.perf_counter() - start)
cpu, wall = time.process_time(), time.perf_counter()
time.sleep({idle})
idle = (time.process_time() - cpu) / (time.perf_counter() - wall)
print(json.dumps({{"tokens_per_s": decode, "idle_cores": idle}}))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--idle", type=float, default=2.0, help="seconds of idle measured")
    parser.add_argument("--dequantize", action="store_true",
                        help="float weights instead of the GGUF's blocks")
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS),
                        default=list(SETTINGS))
    return parser.parse_args()


def run_child(setting: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = CHILD.format(model=args.model, dequantize=args.dequantize, new_tokens=args.new_tokens, idle=args.idle)
    result = subprocess.run([sys.executable, "-c", code], env={**env, **setting},
                            capture_output=True, text=True, check=False)
    if result.returncode:
        sys.exit(f"the child process failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    import hwplug

    args = parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.settings}
    for _ in range(args.rounds):
        for name in args.settings:
            runs[name].append(run_child(SETTINGS[name], args))
    facts = hwplug.current_platform().facts
    print(f"CPU: {facts.device_name} ({os.cpu_count()} cores; features "
          f"{' '.join(sorted(facts.features & {'avx2', 'avx512f', 'amx_tile', 'fma'}))}); "
          f"model {args.model or 'default'}, weights "
          f"{'dequantized fp32' if args.dequantize else 'GGUF kept'}; batch 1, "
          f"{args.new_tokens} new tokens; median of {args.rounds} alternating rounds")
    base = statistics.median(r["tokens_per_s"] for r in runs.get("default", runs[args.settings[0]]))
    print("| setting | decode tok/s | vs default | idle cores busy |\n|---|---|---|---|")
    for name, results in runs.items():
        speed = statistics.median(r["tokens_per_s"] for r in results)
        idle = statistics.median(r["idle_cores"] for r in results)
        print(f"| {name} | {speed:.1f} | {speed / base:.2f}x | {idle:.2f} |")


if __name__ == "__main__":
    main()
