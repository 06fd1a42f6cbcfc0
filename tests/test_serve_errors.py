"""Bad requests to ``hwplug serve`` get 4xx answers in OpenAI's error shape, never a 500.

Each row of :data:`CASES` is sent as raw bytes (so bodies that are not JSON, not UTF-8
or too large can be) and must be answered with its status and a JSON error naming the
field at fault; the server then still answers a good request.
"""

from __future__ import annotations

import json

import httpx
import pytest
from serve_harness import MAX_REQUEST_BYTES, MODEL

pytestmark = pytest.mark.slow  # loads the real model and starts a server

COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def completion(**changes) -> bytes:
    return json.dumps({**COMPLETION, **changes}).encode()


def chat(**changes) -> bytes:
    return json.dumps({**CHAT, **changes}).encode()


def without(body: dict, name: str) -> bytes:
    return json.dumps({k: v for k, v in body.items() if k != name}).encode()


#: (id, method, path, body, status, the field named in ``param`` or None)
CASES = [
    ("n-string", "POST", "/v1/completions", completion(n="2"), 400, "n"),
    ("n-zero", "POST", "/v1/completions", completion(n=0), 400, "n"),
    ("n-huge", "POST", "/v1/completions", completion(n=10**6), 400, "n"),
    ("n-float", "POST", "/v1/completions", completion(n=1.5), 400, "n"),
    ("max-tokens-negative", "POST", "/v1/completions", completion(max_tokens=-1), 400,
     "max_tokens"),
    ("max-tokens-beyond-context", "POST", "/v1/completions", completion(max_tokens=10**9),
     400, "max_tokens"),
    ("max-tokens-bool", "POST", "/v1/completions", completion(max_tokens=True), 400,
     "max_tokens"),
    ("temperature-negative", "POST", "/v1/completions", completion(temperature=-0.5), 400,
     "temperature"),
    ("temperature-string", "POST", "/v1/completions", completion(temperature="hot"), 400,
     "temperature"),
    ("top-p-zero", "POST", "/v1/completions", completion(top_p=0), 400, "top_p"),
    ("top-p-above-one", "POST", "/v1/completions", completion(top_p=1.5), 400, "top_p"),
    ("top-k-below-minus-one", "POST", "/v1/completions", completion(top_k=-2), 400, "top_k"),
    ("frequency-penalty-above-two", "POST", "/v1/completions",
     completion(frequency_penalty=2.5), 400, "frequency_penalty"),
    ("presence-penalty-string", "POST", "/v1/completions", completion(presence_penalty="x"),
     400, "presence_penalty"),
    ("seed-negative", "POST", "/v1/completions", completion(seed=-1), 400, "seed"),
    ("seed-huge", "POST", "/v1/completions", completion(seed=2**70), 400, "seed"),
    ("stop-empty-string", "POST", "/v1/completions", completion(stop=[""]), 400, "stop"),
    ("stop-number", "POST", "/v1/completions", completion(stop=5), 400, "stop"),
    ("stop-too-many", "POST", "/v1/completions", completion(stop=[str(i) for i in range(40)]),
     400, "stop"),
    ("stop-token-negative", "POST", "/v1/completions", completion(stop_token_ids=[-1]), 400,
     "stop_token_ids[0]"),
    ("stop-token-beyond-vocabulary", "POST", "/v1/completions",
     completion(stop_token_ids=[10**9]), 400, "stop_token_ids"),
    ("logprobs-too-many", "POST", "/v1/completions", completion(logprobs=21), 400, "logprobs"),
    ("logprobs-bool", "POST", "/v1/completions", completion(logprobs=True), 400, "logprobs"),
    ("unknown-field", "POST", "/v1/completions", completion(frobnicate=1), 400, "frobnicate"),
    ("prompt-missing", "POST", "/v1/completions", without(COMPLETION, "prompt"), 400,
     "prompt"),
    ("prompt-empty-list", "POST", "/v1/completions", completion(prompt=[]), 400, "prompt"),
    ("prompt-mixed-list", "POST", "/v1/completions", completion(prompt=[1, "a"]), 400,
     "prompt"),
    ("prompt-token-beyond-vocabulary", "POST", "/v1/completions",
     completion(prompt=[10**8]), 400, "prompt"),
    ("prompt-beyond-context", "POST", "/v1/completions", completion(prompt=[1] * 50_000), 413,
     "prompt"),
    ("echo-int", "POST", "/v1/completions", completion(echo=1), 400, "echo"),
    ("stream-string", "POST", "/v1/completions", completion(stream="yes"), 400, "stream"),
    ("stream-options-without-stream", "POST", "/v1/completions",
     completion(stream_options={"include_usage": True}), 400, "stream_options"),
    ("unknown-model", "POST", "/v1/completions", completion(model="gpt-4"), 404, "model"),
    ("invalid-utf8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe"}', 400, None),
    ("not-json", "POST", "/v1/completions", b"prompt=hello", 400, None),
    ("json-array", "POST", "/v1/completions", b"[1, 2]", 400, None),
    ("nan", "POST", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, None),
    ("lone-surrogate", "POST", "/v1/completions", b'{"prompt": "\\ud800"}', 400, None),
    ("oversized-body", "POST", "/v1/completions",
     completion(prompt="x" * (MAX_REQUEST_BYTES + 1)), 413, None),
    ("chat-no-messages", "POST", "/v1/chat/completions", chat(messages=[]), 400, "messages"),
    ("chat-messages-missing", "POST", "/v1/chat/completions", without(CHAT, "messages"), 400,
     "messages"),
    ("chat-unknown-role", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "bot", "content": "x"}]), 400, "messages[0].role"),
    ("chat-image-content", "POST", "/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "messages[0].content"),
    ("chat-top-logprobs-without-logprobs", "POST", "/v1/chat/completions",
     chat(top_logprobs=2), 400, "top_logprobs"),
    ("chat-two-token-limits", "POST", "/v1/chat/completions", chat(max_completion_tokens=2),
     400, "max_completion_tokens"),
    ("chat-json-schema-without-schema", "POST", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400,
     "response_format.json_schema"),
    ("chat-invalid-json-schema", "POST", "/v1/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {
         "name": "x", "schema": {"type": "no-such-type"}}}), 400, None),
    ("chat-unknown-response-format", "POST", "/v1/chat/completions",
     chat(response_format={"type": "yaml"}), 400, "response_format.type"),
    ("tokenize-prompt-and-messages", "POST", "/tokenize",
     json.dumps({"prompt": "x", "messages": CHAT["messages"]}).encode(), 400, "prompt"),
    ("detokenize-negative", "POST", "/detokenize", b'{"tokens": [-5]}', 400, "tokens[0]"),
    ("embeddings-of-a-decoder", "POST", "/v1/embeddings", b'{"input": "x"}', 400, "model"),
    ("unknown-route", "POST", "/v1/nothing", b"{}", 404, None),
    ("wrong-method", "GET", "/v1/completions", b"", 405, None),
]


@pytest.fixture(scope="module")
def http(served) -> httpx.Client:
    with httpx.Client(base_url=served.url, timeout=60) as client:
        yield client


@pytest.mark.parametrize(("method", "path", "body", "status", "param"),
                         [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_bad_request_gets_a_json_error(http, method, path, body, status, param):
    response = http.request(method, path, content=body,
                            headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and "Traceback" not in error["message"]
    assert error["type"] in {"invalid_request_error", "authentication_error"}
    if param is not None:
        assert error["param"] == param
        assert param.split("[")[0].split(".")[0] in error["message"]


def test_the_cases_cover_every_kind_of_bad_input():
    assert len(CASES) >= 30
    assert len({case[0] for case in CASES}) == len(CASES)


def test_the_server_still_answers_after_the_bad_requests(http):
    response = http.post("/v1/completions", content=completion())
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 2
