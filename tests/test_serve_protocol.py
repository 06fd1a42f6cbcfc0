"""The request bodies of ``hwplug serve``, checked without a server: each bad body is an
``ApiError`` whose message names the field and its valid values; good bodies parse."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic", reason="needs the serve extra")

from hwplug.serve.protocol import (  # noqa: E402 (after the skip)
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    parse_body,
)


def completion(**fields) -> bytes:
    return json.dumps({"prompt": "Hi", **fields}).encode()


@pytest.mark.parametrize(("body", "param", "message"), [
    (completion(temperature=5), "temperature", "temperature: must be in [0, 2], got 5"),
    (completion(top_p=0), "top_p", "top_p: must be in (0, 1], got 0"),
    (completion(n=0), "n", "n: must be in [1, 128], got 0"),
    (completion(max_tokens=0), "max_tokens", "max_tokens: must be >= 1, got 0"),
    (completion(n=1.5), "n", "n: Input should be a valid integer, got 1.5"),
    (completion(n=True), "n", "n: Input should be a valid integer, got true"),
    (completion(frobnicate=1), "frobnicate", "unknown field 'frobnicate'"),
    (b"{}", "prompt", "the field 'prompt' is required"),
    (completion(prompt=[1, True]), "prompt", "prompt: must be a non-empty string, a list of "
                                             "token ids, or a non-empty list of those"),
    (completion(stop=["a", ""]), "stop", "stop: must be a non-empty string or a list of at "
                                         "most 16 non-empty strings"),
    (completion(stop_token_ids=[-1]), "stop_token_ids[0]", "stop_token_ids[0]: Input should "
                                                           "be greater than or equal to 0"),
    (completion(stream_options={"include_usage": 1}), "stream_options.include_usage",
     "stream_options.include_usage: Input should be a valid boolean, got 1"),
    (b'\xff{}', None, "the body is not valid UTF-8: byte 0xff at offset 0"),
    (b'{"prompt": "x",}', None, "the body is not valid JSON"),
    (b'"text"', None, "the body must be a JSON object, got str"),
    (b'{"prompt": "x", "temperature": Infinity}', None, "the body holds Infinity"),
    (b'{"prompt": "\\udc80"}', None, "lone UTF-16 surrogate"),
])
def test_a_bad_completion_body_names_its_field(body, param, message):
    with pytest.raises(ApiError) as raised:
        parse_body(body, CompletionRequest)
    error = raised.value.body()["error"]
    assert raised.value.status == 400 and error["param"] == param
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_good_bodies_parse_with_openais_defaults():
    body = parse_body(completion(prompt=[[1, 2], "x"], stop="\n"), CompletionRequest)
    assert body.prompts() == [[1, 2], "x"] and body.stop_strings() == ("\n",)
    assert (body.n, body.temperature, body.max_tokens, body.stream) == (1, 1.0, None, False)
    chat = parse_body(json.dumps({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "text", "text": "b"}]}]}).encode(),
        ChatCompletionRequest)
    assert [m.text() for m in chat.messages] == ["Be brief.", "ab"]
    assert parse_body(b'{"input": ["a", "b"]}', EmbeddingRequest).texts() == ["a", "b"]


@pytest.mark.parametrize("content", [[{"type": "image_url", "image_url": {}}], 5,
                                     [{"type": "text"}]])
def test_chat_content_is_text_only(content):
    body = json.dumps({"messages": [{"role": "user", "content": content}]}).encode()
    with pytest.raises(ApiError, match=r"messages\[0\]\.content"):
        parse_body(body, ChatCompletionRequest)
