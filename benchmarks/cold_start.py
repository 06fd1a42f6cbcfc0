"""Cold start: seconds from process start to the first generated token, twice.

Each run is a fresh ``python -c`` process that imports hwplug, builds ``hwplug.LLM()``
(the default model, its GGUF blocks kept as hwplug loads it by default) and generates one
token. The first run may fill hwplug's cache (converted config and tokenizer, the weights
in GGUF blocks); the second must reuse it. By default both runs share a new temporary
``HWPLUG_CACHE_DIR`` so the first is truly cold; pass ``--cache-dir`` to use another (e.g.
your usual one: its built kernels are reused), and ``--fresh`` to discard the model's
conversion and repacked weights there first, so run 1 reports a first load's cost (convert,
repack, write the repacked-weights cache) and the later runs a second one. ``--tokens N``
then times a second generation, of N tokens: what a process's first decode steps cost
beyond the replayed ones (the engine records its step graph at the second decode step);
``--warm-up`` times ``LLM.warm_up()`` after it (every decode bucket's step graph recorded,
as ``hwplug serve`` does before it answers).

    python benchmarks/cold_start.py
    python benchmarks/cold_start.py --model smollm2 --runs 3 --tokens 8
    python benchmarks/cold_start.py --model M.gguf --cache-dir ~/.cache/hwplug --fresh
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

#: The measured process; prints the wall-clock times of its milestones as JSON.
CHILD = """
import json, sys, time
import hwplug
imported = time.time()
llm = hwplug.LLM({model!r})
loaded = time.time()
llm.generate("Hello", hwplug.SamplingParams(max_tokens=1))
marks = {{"imported": imported, "loaded": loaded, "first_token": time.time()}}
if {tokens}:
    start = time.time()
    llm.generate("Hello", hwplug.SamplingParams(max_tokens={tokens}, ignore_eos=True))
    marks["tokens"] = time.time() - start
if {warm_up}:
    start = time.time()
    llm.warm_up()
    marks["warm_up"] = time.time() - start
print(json.dumps(marks))
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path or alias (default: the default model)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--cache-dir", help="HWPLUG_CACHE_DIR for the runs (default: a new "
                                            "temporary directory)")
    parser.add_argument("--fresh", action="store_true",
                        help="discard the model's conversion and repacked weights in the "
                             "cache before run 1")
    parser.add_argument("--tokens", type=int, default=0, metavar="N",
                        help="also time a second generation of N tokens (seconds it took)")
    parser.add_argument("--warm-up", action="store_true",
                        help="also time LLM.warm_up() (seconds it took)")
    return parser.parse_args()


def discard_model(model: str | None) -> None:
    """Remove ``model``'s GGUF conversion and its repacked-weights entries from the cache
    (``HWPLUG_CACHE_DIR`` of this process)."""
    from hwplug.model_zoo.loaders import cache, repacked_cache
    from hwplug.model_zoo.loaders.gguf_file import BLOCKS_CACHE_KIND, REPACKED_NAME
    from hwplug.model_zoo.loaders.resolve import resolve_model

    gguf = resolve_model(model)
    entry = cache.entry_dir(gguf, BLOCKS_CACHE_KIND)
    removed = sum(repacked_cache.discard_for(source) for source in (gguf, entry / REPACKED_NAME))
    if entry.is_dir():
        cache.discard(entry)
    print(f"discarded the conversion of {gguf.name} and {removed} repacked-weights entries")


#: Marks that are durations, not times since launch.
DURATIONS = ("tokens", "warm_up")


def run_once(model: str | None, cache_dir: str, tokens: int,
             warm_up: bool) -> dict[str, float]:
    """Seconds from launch to import done, model loaded and first token; with ``tokens``,
    also the seconds a second generation of that many tokens took, with ``warm_up`` the
    seconds ``LLM.warm_up()`` took."""
    env = {**os.environ, "HWPLUG_CACHE_DIR": cache_dir}
    start = time.time()
    child = CHILD.format(model=model, tokens=tokens, warm_up=warm_up)
    result = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True,
                            text=True, check=False)
    if result.returncode:
        sys.exit(f"the child process failed:\n{result.stderr}")
    marks = json.loads(result.stdout.strip().splitlines()[-1])
    return {name: stamp if name in DURATIONS else stamp - start
            for name, stamp in marks.items()}


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="hwplug-cold-start-") as scratch:
        cache_dir = args.cache_dir or scratch
        if args.fresh:
            os.environ["HWPLUG_CACHE_DIR"] = cache_dir
            discard_model(args.model)
        print(f"HWPLUG_CACHE_DIR={cache_dir}; seconds since process launch")
        then = f" {f'then {args.tokens} tokens':>16}" if args.tokens else ""
        then += f" {'warm-up':>8}" if args.warm_up else ""
        print(f"{'run':>3} {'import':>8} {'loaded':>8} {'first token':>12}{then}")
        for run in range(1, args.runs + 1):
            marks = run_once(args.model, cache_dir, args.tokens, args.warm_up)
            then = f" {marks['tokens']:>16.2f}" if args.tokens else ""
            then += f" {marks['warm_up']:>8.2f}" if args.warm_up else ""
            print(f"{run:>3} {marks['imported']:>8.2f} {marks['loaded']:>8.2f} "
                  f"{marks['first_token']:>12.2f}{then}", flush=True)


if __name__ == "__main__":
    main()
