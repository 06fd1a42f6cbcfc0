"""Peak memory of ``hwplug generate``: peak RSS and wall time of an 8-token generate, side by
side with other ``hwplug`` installs (e.g. main's) and llama.cpp, and where the memory goes.

Each run is a fresh process, measured by the kernel (``os.wait4``'s ``ru_maxrss``: the
peak resident set, file-backed pages of mapped weights included); every runner runs each
model ``--runs`` times and the last run is reported (the first may convert the GGUF into
hwplug's cache). ``--breakdown`` instead runs this checkout's ``hwplug.LLM`` in one process
and prints ``VmRSS`` / ``RssAnon`` / ``RssFile`` once torch is imported, at the milestones
of its build (from its log: before the model is allocated, so after the config and the
tokenizer load; after the weights load, before the KV cache, after it) and after
generating (run it with another install's python to see that one's).

    python benchmarks/generate_memory.py --model /work/models/x.gguf \\
        --hwplug main=/work/main/.venv/bin/hwplug --llama-cpp /work/main/.venv/bin/python
    python benchmarks/generate_memory.py --model /work/models/x.gguf --breakdown
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "def fib(n):"
#: llama-cpp-python generating the same tokens (``n_ctx``: hwplug's default max_model_len).
LLAMA_CPP = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]),
            verbose=False)
llm.create_completion(sys.argv[4], max_tokens=int(sys.argv[5]), temperature=0.0)
"""
#: Log messages of hwplug's build that mark a milestone, by their start.
MILESTONES = ("building", "the model needs", "quantization", "KV cache")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="a .gguf (repeat)")
    parser.add_argument("--hwplug", action="append", default=[], metavar="LABEL=EXE",
                        help="another hwplug executable to compare (repeat)")
    parser.add_argument("--llama-cpp", metavar="PYTHON",
                        help="a python with llama_cpp installed, to run llama.cpp too")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--n-ctx", type=int, default=4096, help="llama.cpp's context")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--breakdown", action="store_true",
                        help="print this checkout's memory at the milestones of one run")
    return parser.parse_args()


def measure(command: list[str]) -> tuple[float, float, int]:
    """Run ``command``; (peak RSS in GiB, wall seconds, exit status)."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.stderr.close()
    return usage.ru_maxrss / 2**20, seconds, os.waitstatus_to_exitcode(status)


def compare(args: argparse.Namespace) -> None:
    runners = [("this checkout", [str(Path(sys.executable).with_name("hwplug"))])]
    for spec in args.hwplug:
        label, _, exe = spec.partition("=")
        runners.append((label, [exe]))
    print(f"{'model':<42} {'runner':<14} {'peak RSS':>9} {'wall':>8}")
    for model in args.model:
        rows = [(label, [*exe, "generate", PROMPT, "--model", model, "--max-tokens",
                         str(args.max_tokens)]) for label, exe in runners]
        if args.llama_cpp:
            rows.append(("llama.cpp", [args.llama_cpp, "-c", LLAMA_CPP, model,
                                       str(args.n_ctx), str(os.cpu_count()), PROMPT,
                                       str(args.max_tokens)]))
        for label, command in rows:
            for _ in range(args.runs):
                peak, seconds, status = measure(command)
            failed = f"  (exit {status})" if status else ""
            print(f"{Path(model).name:<42} {label:<14} {peak:>6.2f} GiB {seconds:>6.1f} s"
                  f"{failed}", flush=True)


def _status() -> str:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if line.startswith(("VmRSS", "RssAnon", "RssFile", "VmHWM")))
    gib = {k: int(v.split()[0]) / 2**20 for k, v in fields.items()}
    return (f"RSS {gib['VmRSS']:5.2f}  anon {gib['RssAnon']:5.2f}  file {gib['RssFile']:5.2f}"
            f"  peak {gib['VmHWM']:5.2f} GiB")


class _Milestones(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(MILESTONES):
            print(f"{message[:60]:<62} {_status()}", flush=True)


def breakdown(args: argparse.Namespace) -> None:
    import hwplug

    print(f"{'start (hwplug imported)':<62} {_status()}")
    hwplug.current_platform().apply_process_env()  # as hwplug.LLM would, before torch loads
    import torch  # noqa: F401 - its import's memory on a line of its own

    print(f"{'torch imported':<62} {_status()}")
    logger = logging.getLogger("hwplug")
    logger.setLevel(logging.INFO)
    logger.addHandler(_Milestones())
    for model in args.model:
        llm = hwplug.LLM(model, max_num_seqs=1)
        print(f"{'built (weights, KV cache, step graphs)':<62} {_status()}")
        llm.generate(PROMPT, hwplug.SamplingParams(max_tokens=args.max_tokens))
        print(f"{f'generated {args.max_tokens} tokens':<62} {_status()}")
        settled = llm.config.describe()  # what this checkout's version settles
        for name in ("num_kv_blocks", "kv_cache", "weights"):
            if name in settled:
                print(f"{name}: {settled[name]}")
        llm.close()


def main() -> None:
    args = parse_args()
    if args.breakdown:
        breakdown(args)
    else:
        compare(args)


if __name__ == "__main__":
    sys.exit(main())
