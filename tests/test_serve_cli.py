"""``hwplug serve`` as a command: bad flags, a port in use, and SIGTERM's graceful shutdown.

The shutdown test starts ``python -m hwplug serve`` on a free port (whose warm-up has
recorded every decode batch bucket's step graph before it answers: ``/metrics`` says so,
and the burst's decode steps then never run eagerly), begins 8 streamed requests, sends
SIGTERM once each has its first token, and checks that every stream still
gets all its tokens, that a new request on a fresh connection is refused meanwhile
(connection refused, or 503), and that the process exits with status 0.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import hwplug
from hwplug.cli.main import main

HWPLUG = [sys.executable, "-m", "hwplug"]


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--port", "70000"], "must be in [0, 65535]"),
    (["serve", "--port", "http"], "is not an integer"),
    (["serve", "--shutdown-timeout", "-1"], "must be a finite number >= 0"),
    (["serve", "--max-queued-requests", "-3"], "must be at least 0"),
    (["serve", "--max-num-seqs", "0"], "max_num_seqs"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_port_in_use_fails_before_the_model_loads(capsys):
    pytest.importorskip("uvicorn", reason="needs the serve extra")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err


#: Streams running when SIGTERM arrives in the shutdown test, and the tokens each asks for.
STREAMS = 8
STREAM_TOKENS = 24


def _stream_all(httpx, url: str, started: threading.Barrier) -> list[str]:
    """One streamed completion of ``STREAM_TOKENS`` tokens on its own connection: waits at
    ``started`` once its first event has arrived, then returns every event line."""
    with httpx.Client(timeout=120) as client, client.stream(
            "POST", url + "/v1/completions", json={
                "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True,
                "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}) as stream:
        events = stream.iter_lines()
        lines = [next(line for line in events if line)]
        started.wait(timeout=120)
        lines += [line for line in events if line]
    return lines


def _metrics(httpx, url: str) -> dict[str, float]:
    """``/metrics`` as sample name -> value."""
    lines = httpx.get(url + "/metrics", timeout=30).text.splitlines()
    return {name: float(value) for name, _, value in (
        line.rpartition(" ") for line in lines if line and not line.startswith("#"))}


def _refused(httpx, url: str) -> bool:
    """Whether a new request on a fresh connection is refused: no connection, 503, or a
    connection closed unanswered (accepted into the backlog as the listener closed)."""
    try:
        with httpx.Client(timeout=30) as client:
            return client.post(url + "/v1/completions", json={
                "prompt": "Hi", "max_tokens": 1}).status_code == 503
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True


@pytest.mark.slow  # loads the real model in a server process
def test_sigterm_finishes_the_running_streams_then_exits_0():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn", reason="needs the serve extra")
    server = subprocess.Popen(
        [*HWPLUG, "serve", "--port", "0", "--dequantize", "--shutdown-timeout", "60",
         "--max-num-seqs", str(STREAMS)],
        stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in server.stderr:  # the model loads, then the address is printed
            found = re.search(r"at (http://\S+)/v1", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server printed no address"
        # float weights replay where the CPU has AVX2's C kernels (tests/test_step_graphs.py)
        replays = {"avx2", "fma", "f16c"} <= hwplug.current_platform().facts.features
        warmed = _metrics(httpx, url)
        assert warmed["hwplug_step_graph_buckets"] == (4 if replays else 0)  # 1, 2, 4, 8
        assert warmed["hwplug_eager_decode_steps_total"] == 0
        started = threading.Barrier(STREAMS + 1)
        with ThreadPoolExecutor(STREAMS) as pool:
            streams = [pool.submit(_stream_all, httpx, url, started) for _ in range(STREAMS)]
            started.wait(timeout=120)  # every stream has its first event
            if replays:  # the burst's first decode steps replayed: nothing was recorded
                assert _metrics(httpx, url)["hwplug_eager_decode_steps_total"] == 0
            server.send_signal(signal.SIGTERM)
            refused = _refused(httpx, url)
            while not refused and not all(stream.done() for stream in streams):
                refused = _refused(httpx, url)
            results = [stream.result() for stream in streams]
        assert refused, "a new request was served while the server shut down"
        texts = []
        for lines in results:
            assert lines[-1] == "data: [DONE]"
            data = [json.loads(line[6:]) for line in lines[:-1]]
            assert data[-1]["usage"]["completion_tokens"] == STREAM_TOKENS
            texts.append("".join(event["choices"][0]["text"] for event in data
                                 if event["choices"]))
        assert len(set(texts)) == 1  # greedy, the same prompt: the same text in every stream
        assert server.wait(timeout=60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
