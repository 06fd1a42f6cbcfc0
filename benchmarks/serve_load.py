"""Load on an OpenAI-compatible server: N concurrent streaming clients over loopback.

Each of ``--clients`` clients sends ``--requests`` streamed completions one after the
other (``max_tokens`` new tokens, ``ignore_eos`` so every request makes exactly that many;
greedy), and records the time to its first token and between tokens. The run is bounded
by its request count and by ``--time-limit`` seconds (requests not started by then are
skipped and counted). Printed as JSON: requests completed and whether each produced
exactly ``max_tokens`` tokens (counted from the stream's usage chunk, or where a server
sends none, e.g. llama-cpp-python's, as its chunks of one token each, not counting a
last one that only gives the finish reason), output tokens per
second over the run, and time to first token and inter-token latency p50/p99 in ms.

Against a running server (``hwplug serve --port 8000``, or any other server of the same
API, e.g. a peer's, for side-by-side runs)::

    python benchmarks/serve_load.py --url http://127.0.0.1:8000 --clients 8 --requests 4

Without ``--url`` it starts ``hwplug serve`` itself on a free port, with the
``--server-args`` given, and stops it afterwards::

    python benchmarks/serve_load.py --clients 4 --requests 2 --server-args=--dequantize
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

import httpx


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="base URL of a running server (default: start one)")
    parser.add_argument("--model", default="smollm2", help="the model name sent")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=4, help="per client")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--prompt", default="Write a short story about a lighthouse keeper.")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds")
    parser.add_argument("--server-args", default="", help="flags for the hwplug serve this "
                                                          "starts (without --url)")
    return parser.parse_args()


async def one_request(client: httpx.AsyncClient, args: argparse.Namespace) -> dict:
    """One streamed completion: its first-token time, gaps between tokens, token count
    (``args.extra_body``, where set, is merged into the request)."""
    body = {"model": args.model, "prompt": args.prompt, "max_tokens": args.max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **getattr(args, "extra_body", {})}
    start = time.perf_counter()
    stamps, tokens, chunks = [], None, 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                choice = chunk["choices"][0]
                chunks += bool(choice["text"] or choice.get("finish_reason") is None)
                if choice["text"]:
                    stamps.append(time.perf_counter())
    return {"ttft": stamps[0] - start if stamps else None,
            "itl": [b - a for a, b in itertools.pairwise(stamps)],
            "tokens": chunks if tokens is None else tokens}


async def run(args: argparse.Namespace, url: str) -> dict:
    deadline = time.perf_counter() + args.time_limit
    results, skipped = [], 0

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal skipped
        for _ in range(args.requests):
            if time.perf_counter() > deadline:
                skipped += 1
                continue
            results.append(await one_request(client, args))

    limits = httpx.Limits(max_connections=args.clients)
    async with httpx.AsyncClient(base_url=url, timeout=args.time_limit, limits=limits) as c:
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(c) for _ in range(args.clients)))
        seconds = time.perf_counter() - start
    ttft = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    itl = sorted(gap for r in results for gap in r["itl"])
    return {
        "clients": args.clients, "requests_completed": len(results), "skipped": skipped,
        "all_complete": all(r["tokens"] == args.max_tokens for r in results),
        "output_tokens_per_s": round(sum(r["tokens"] or 0 for r in results) / seconds, 1),
        "seconds": round(seconds, 2),
        "ttft_ms": {"p50": _ms(ttft, 0.5), "p99": _ms(ttft, 0.99)},
        "itl_ms": {"p50": _ms(itl, 0.5), "p99": _ms(itl, 0.99)}}


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0] * 1000, 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[
        max(0, round(q * 100) - 1)] * 1000, 2)


def start_server(extra: str) -> tuple[subprocess.Popen, str]:
    """``hwplug serve --port 0`` and its URL, once it listens; the rest of its stderr is
    passed on to ours by a thread, so that a chatty server never blocks on the pipe."""
    server = subprocess.Popen([sys.executable, "-m", "hwplug", "serve", "--port", "0",
                               *shlex.split(extra)], stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        found = re.search(r"at (http://\S+)/v1", line)
        if found:
            threading.Thread(target=shutil.copyfileobj, args=(server.stderr, sys.stderr),
                             daemon=True).start()
            return server, found.group(1)
    server.wait()
    raise SystemExit(f"hwplug serve exited with status {server.returncode}")


def stop_server(server: subprocess.Popen, grace: float = 120.0) -> None:
    """SIGTERM, up to ``grace`` seconds for the graceful shutdown, then SIGKILL."""
    server.terminate()
    try:
        server.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main() -> None:
    args = parse_args()
    server = None
    url = args.url
    if url is None:
        server, url = start_server(args.server_args)
    try:
        print(json.dumps(asyncio.run(run(args, url)), indent=2))
    finally:
        if server is not None:
            stop_server(server)


if __name__ == "__main__":
    main()
