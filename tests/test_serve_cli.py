"""``hwplug serve`` as a command: bad flags, a port in use, and SIGTERM's graceful shutdown.

The shutdown test starts ``python -m hwplug serve`` on a free port, begins a streamed
request, sends SIGTERM, and checks that the request still gets all its tokens, that the
server refuses new work meanwhile, and that the process exits with status 0.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys

import pytest

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


@pytest.mark.slow  # loads the real model in a server process
def test_sigterm_finishes_the_running_request_then_exits_0():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("uvicorn", reason="needs the serve extra")
    server = subprocess.Popen(
        [*HWPLUG, "serve", "--port", "0", "--dequantize", "--shutdown-timeout", "60"],
        stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in server.stderr:  # the model loads, then the address is printed
            found = re.search(r"at (http://\S+)/v1", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server printed no address"
        with httpx.Client(timeout=120) as client, client.stream(
                "POST", url + "/v1/completions", json={
                    "prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True,
                    "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}) as stream:
            events = stream.iter_lines()
            first = next(line for line in events if line)
            server.send_signal(signal.SIGTERM)
            rest = [line for line in events if line]
        data = [json.loads(line[6:]) for line in [first, *rest] if line != "data: [DONE]"]
        assert rest[-1] == "data: [DONE]"
        assert data[-1]["usage"]["completion_tokens"] == 40
        assert server.wait(timeout=60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health")
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        server.stderr.close()
