"""The real server for the ``hwplug serve`` tests: uvicorn on a free loopback port, in a thread.

One ``LLM`` (the packaged SmolLM2, float weights, whose greedy tokens do not depend on
the batch) is loaded once per session and served by the apps the tests start over it;
each test compares what the server answers with what ``LLM.generate`` gives for the same
request. :func:`metrics` reads ``/metrics`` into a dict of sample name -> value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

import hwplug

#: The engine's limits in these tests: 4 sequences at once, 2 more requests may queue.
MAX_NUM_SEQS = 4
MAX_QUEUED = 2
MAX_REQUEST_BYTES = 2**20
MODEL = "smollm2"
API_KEY = "test-key"


@dataclass
class Served:
    """A running server: its base URL (``.../v1`` is the API's) and its ``LLM``."""

    url: str
    llm: hwplug.LLM

    @property
    def api(self) -> str:
        return self.url + "/v1"


@contextmanager
def running(llm: hwplug.LLM, **app_options: Any) -> Iterator[Served]:
    """Serve ``llm`` (``create_app`` with ``app_options``) until the block ends."""
    from hwplug.serve.app import create_app
    from hwplug.serve.server import Server, bind

    options = {"model_name": MODEL, "max_queued_requests": MAX_QUEUED,
               "max_request_bytes": MAX_REQUEST_BYTES, **app_options}
    app = create_app(llm, **options)
    sock = bind("127.0.0.1", 0)
    server = Server(app, shutdown_timeout=5)
    thread = threading.Thread(target=server.serve_forever, args=([sock],), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Served(f"http://127.0.0.1:{sock.getsockname()[1]}", llm)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="session", name="serve_llm")
def serve_llm_fixture() -> Iterator[hwplug.LLM]:
    pytest.importorskip("fastapi", reason="needs the serve extra")
    llm = hwplug.LLM(dequantize=True, max_num_seqs=MAX_NUM_SEQS, num_kv_blocks=512)
    yield llm
    llm.close()


@pytest.fixture(scope="session", name="served")
def served_fixture(serve_llm: hwplug.LLM) -> Iterator[Served]:
    with running(serve_llm) as server:
        yield server


def metrics(server: Served) -> dict[str, float]:
    """``/metrics`` as sample name (with labels) -> value."""
    import httpx

    text = httpx.get(server.url + "/metrics", timeout=30).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def wait_until_idle(server: Served, timeout: float = 60) -> dict[str, float]:
    """Poll ``/metrics`` until no request is in flight and no KV block is in use (an
    assertion error after ``timeout`` seconds); returns the last reading."""
    deadline = time.monotonic() + timeout
    while True:
        values = metrics(server)
        if (values["hwplug_requests_in_flight"] == 0 and values["hwplug_kv_blocks_used"] == 0
                and values["hwplug_num_requests_running"] == 0):
            return values
        assert time.monotonic() < deadline, f"the server did not become idle: {values}"
        time.sleep(0.05)
