"""Soak test of ``hwplug serve``: many clients for a bounded time, with abandoned streams
and bad requests mixed in (a script to run by hand, not part of CI).

``--clients`` clients (default 64) each send requests one after the other for
``--minutes`` (default 10). Each request is drawn at random:

* a good one (most): a streamed completion or chat completion of 4 to ``--max-tokens``
  tokens with ``ignore_eos``; it must answer 200, stream every token it asked for (the
  usage chunk counts them) and end with ``[DONE]``, else it is an error;
* an abandoned one (``--disconnect-fraction``): the same, but the client closes the
  connection after a random number of chunks;
* a bad one (``--bad-fraction``): a row of :data:`BAD_REQUESTS` (the idea of
  tests/test_serve_errors.py), which must get its 4xx status with OpenAI's error shape.

Requests under way at the deadline are finished. Meanwhile ``/health`` is polled every ``--health-interval`` seconds (every answer must be
200) and the server process's resident memory is sampled every ``--rss-interval``
seconds (from ``/proc``, so Linux only). At the end the server must go idle (no request in
flight, no KV block in use, per ``/metrics``). Printed as JSON; the exit status is 1 when a
good request failed, a bad one got an unexpected answer, ``/health`` answered anything but
200, or the server did not go idle.

It starts ``hwplug serve`` itself on a free port (``--server-args`` are its flags) and
stops it afterwards::

    python benchmarks/serve_soak.py --minutes 2 --clients 16 --server-args=--dequantize
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
from serve_load import start_server, stop_server

MODEL = "smollm2"

#: (name, path, body, expected status): requests that must be refused with a 4xx.
BAD_REQUESTS: list[tuple[str, str, bytes, int]] = [
    ("n-zero", "/v1/completions", b'{"prompt": "Hi", "n": 0}', 400),
    ("max-tokens-negative", "/v1/completions", b'{"prompt": "Hi", "max_tokens": -1}', 400),
    ("max-tokens-beyond-context", "/v1/completions",
     b'{"prompt": "Hi", "max_tokens": 1000000000}', 400),
    ("temperature-string", "/v1/completions", b'{"prompt": "Hi", "temperature": "hot"}', 400),
    ("top-p-zero", "/v1/completions", b'{"prompt": "Hi", "top_p": 0}', 400),
    ("unknown-field", "/v1/completions", b'{"prompt": "Hi", "frobnicate": 1}', 400),
    ("prompt-token-beyond-vocabulary", "/v1/completions", b'{"prompt": [100000000]}', 400),
    ("prompt-beyond-context", "/v1/completions",
     json.dumps({"prompt": [1] * 50_000}).encode(), 413),
    ("invalid-utf8", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400),
    ("not-json", "/v1/completions", b"prompt=hello", 400),
    ("nan", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400),
    ("unknown-model", "/v1/completions", b'{"prompt": "Hi", "model": "gpt-4"}', 404),
    ("chat-no-messages", "/v1/chat/completions", b'{"messages": []}', 400),
    ("chat-unknown-role", "/v1/chat/completions",
     b'{"messages": [{"role": "bot", "content": "x"}]}', 400),
    ("chat-invalid-json-schema", "/v1/chat/completions", json.dumps({
        "messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"name": "x",
                                                    "schema": {"type": "no-such-type"}}}
    }).encode(), 400),
    ("unknown-route", "/v1/nothing", b"{}", 404),
]

PROMPTS = ["Once upon a time", "Write a haiku about rain.", "List three colours:",
           "Explain what a CPU does.", "The capital of France is"]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="largest max_tokens of a good request")
    parser.add_argument("--disconnect-fraction", type=float, default=0.1)
    parser.add_argument("--bad-fraction", type=float, default=0.1)
    parser.add_argument("--health-interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--rss-interval", type=float, default=5.0, help="seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default="", help="flags for the hwplug serve it "
                                                          "starts")
    return parser.parse_args()


class Soak:
    """The counters of one soak run, filled by the clients and the two samplers."""

    def __init__(self, args: argparse.Namespace, pid: int) -> None:
        self.args = args
        self.pid = pid
        self.rng = random.Random(args.seed)
        self.good = self.abandoned = 0
        self.errors: list[str] = []
        self.bad: dict[str, int] = {}
        self.bad_unexpected: list[str] = []
        self.health: dict[str, int] = {}
        self.rss: list[tuple[float, int]] = []

    def good_body(self) -> tuple[str, dict[str, Any]]:
        """A random streamed completion or chat completion, and its route."""
        tokens = self.rng.randint(4, self.args.max_tokens)
        body: dict[str, Any] = {"model": MODEL, "max_tokens": tokens, "ignore_eos": True,
                                "temperature": self.rng.choice([0, 0.8]), "stream": True,
                                "stream_options": {"include_usage": True}}
        prompt = self.rng.choice(PROMPTS)
        if self.rng.random() < 0.5:
            return "/v1/completions", {**body, "prompt": prompt}
        return "/v1/chat/completions", {**body,
                                        "messages": [{"role": "user", "content": prompt}]}

    async def good_request(self, client: httpx.AsyncClient, abandon: bool) -> None:
        """One streamed request; with ``abandon`` the connection is closed mid-stream."""
        path, body = self.good_body()
        stop_after = self.rng.randint(1, body["max_tokens"]) if abandon else None
        chunks, tokens, done = 0, None, False
        try:
            async with client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    self.errors.append(f"{path}: {response.status_code} {response.text[:200]}")
                    return
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        done = True
                    elif line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
                        chunks += 1
                        if stop_after is not None and chunks >= stop_after:
                            self.abandoned += 1
                            return  # leaving the block closes the connection mid-stream
        except httpx.HTTPError as exc:
            self.errors.append(f"{path}: {type(exc).__name__}: {exc}")
            return
        if not done or tokens != body["max_tokens"]:
            self.errors.append(f"{path}: {tokens} tokens of {body['max_tokens']}, "
                               f"[DONE] {'seen' if done else 'missing'}")
        else:
            self.good += 1

    async def bad_request(self, client: httpx.AsyncClient) -> None:
        name, path, body, status = self.rng.choice(BAD_REQUESTS)
        self.bad[name] = self.bad.get(name, 0) + 1
        response = await client.post(path, content=body,
                                     headers={"Content-Type": "application/json"})
        error = response.json().get("error") if response.content else None
        if response.status_code != status or not isinstance(error, dict):
            self.bad_unexpected.append(f"{name}: {response.status_code} {response.text[:200]}")

    async def client_loop(self, client: httpx.AsyncClient, deadline: float) -> None:
        while time.monotonic() < deadline:
            draw = self.rng.random()
            if draw < self.args.bad_fraction:
                await self.bad_request(client)
            else:
                await self.good_request(
                    client, draw < self.args.bad_fraction + self.args.disconnect_fraction)

    async def poll_health(self, client: httpx.AsyncClient, finished: asyncio.Event) -> None:
        while not finished.is_set():
            try:
                status = str((await client.get("/health")).status_code)
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            self.health[status] = self.health.get(status, 0) + 1
            await asyncio.sleep(self.args.health_interval)

    async def sample_rss(self, start: float, finished: asyncio.Event) -> None:
        while not finished.is_set():
            self.rss.append((time.monotonic() - start, rss_bytes(self.pid)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), self.args.rss_interval)

    async def clients(self, client: httpx.AsyncClient, deadline: float,
                      finished: asyncio.Event) -> None:
        """Every client's loop; sets ``finished`` once the last request has ended."""
        try:
            await asyncio.gather(*(self.client_loop(client, deadline)
                                   for _ in range(self.args.clients)))
        finally:
            finished.set()


def rss_bytes(pid: int) -> int:
    """The resident set size of process ``pid`` (``VmRSS`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def wait_idle(client: httpx.AsyncClient, timeout: float = 120) -> dict[str, float]:
    """Poll ``/metrics`` until nothing is in flight and no KV block is used; the last
    reading of those gauges (still non-zero after ``timeout`` seconds: not idle)."""
    names = ("hwplug_requests_in_flight", "hwplug_num_requests_running",
             "hwplug_kv_blocks_used")
    deadline = time.monotonic() + timeout
    while True:
        text = (await client.get("/metrics")).text
        values = {name: float(value) for name, _, value in
                  (line.rpartition(" ") for line in text.splitlines()
                   if line and not line.startswith("#")) if name in names}
        if not any(values.values()) or time.monotonic() > deadline:
            return values
        await asyncio.sleep(0.2)


async def soak(args: argparse.Namespace, url: str, pid: int) -> dict[str, Any]:
    state = Soak(args, pid)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    limits = httpx.Limits(max_connections=args.clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client, \
            httpx.AsyncClient(base_url=url, timeout=30) as monitor:
        finished = asyncio.Event()
        await asyncio.gather(state.poll_health(monitor, finished),
                             state.sample_rss(start, finished),
                             state.clients(client, deadline, finished))
        seconds = time.monotonic() - start
        idle = await wait_idle(monitor)
    state.rss.append((time.monotonic() - start, rss_bytes(pid)))
    mib = [round(rss / 2**20, 1) for _, rss in state.rss]
    warm = mib[min(len(mib) - 1, max(1, len(mib) // 10))]  # after the first tenth
    return {
        "clients": args.clients, "seconds": round(seconds, 1),
        "good_requests_ok": state.good, "good_request_errors": len(state.errors),
        "error_examples": state.errors[:5], "abandoned_streams": state.abandoned,
        "bad_requests": sum(state.bad.values()), "bad_kinds": len(state.bad),
        "bad_unexpected": state.bad_unexpected[:5],
        "health": state.health, "idle_after": idle,
        "rss_mib": {"first": mib[0], "after_warmup": warm, "max": max(mib), "last": mib[-1],
                    "growth_after_warmup": round(mib[-1] - warm, 1),
                    "samples": [[round(t), m] for (t, _), m in zip(state.rss, mib,
                                                                    strict=True)]}}


def main() -> int:
    args = parse_args()
    server, url = start_server(args.server_args)
    try:
        report = asyncio.run(soak(args, url, server.pid))
    finally:
        stop_server(server)
    samples = report["rss_mib"].pop("samples")
    print(json.dumps(report, indent=2))
    print("rss_mib over time [s, MiB]:", json.dumps(samples))
    failed = (report["good_request_errors"] or report["bad_unexpected"]
              or set(report["health"]) != {"200"} or any(report["idle_after"].values()))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
