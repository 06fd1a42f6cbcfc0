"""``hwplug serve``'s API driven by the real ``openai`` client against the real uvicorn.

Every answer is compared with what ``LLM.generate`` gives for the same request on the same
``LLM`` (greedy or seeded, so the tokens do not depend on the batch): whole and streamed
answers, completions and chat, ``n``, stop strings and token ids, log-probabilities,
``echo`` and usage. Then the server's own behaviour: concurrent streams batched together,
a client that disconnects mid-stream (its KV blocks freed, seen through ``/metrics``), a
full queue (503 with ``Retry-After``), the API key, and an encoder's embeddings.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch
from serve_harness import (
    API_KEY,
    MAX_NUM_SEQS,
    MAX_QUEUED,
    MODEL,
    metrics,
    running,
    wait_until_idle,
)

import hwplug
from hwplug.model_zoo.engine import Output

pytestmark = pytest.mark.slow  # loads the real model and starts a server

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
GREEDY = {"max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)


def async_client(served) -> openai.AsyncOpenAI:
    """A client for one ``asyncio.run`` (its connections belong to that event loop)."""
    return openai.AsyncOpenAI(base_url=served.api, api_key="unused", max_retries=0)


def expected(llm: hwplug.LLM, prompt, **sampling) -> Output:
    return llm.generate(prompt, hwplug.SamplingParams(**sampling))[0]


def test_greedy_completions_equal_generate_with_their_usage(client, served):
    answer = client.completions.create(model=MODEL, prompt=PROMPTS, **GREEDY)
    outputs = [expected(served.llm, prompt, max_tokens=12) for prompt in PROMPTS]
    assert [choice.text for choice in answer.choices] == [o.text for o in outputs]
    assert [choice.index for choice in answer.choices] == [0, 1]
    assert [choice.finish_reason for choice in answer.choices] == [o.finish_reason
                                                                  for o in outputs]
    prompt_tokens = sum(len(served.llm.tokenize(prompt)) for prompt in PROMPTS)
    completion_tokens = sum(len(o.token_ids) for o in outputs)
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.completion_tokens == completion_tokens
    assert answer.usage.total_tokens == prompt_tokens + completion_tokens
    assert answer.model == MODEL and answer.object == "text_completion"


def test_frequency_and_presence_penalties_reach_the_sampler(client, served):
    penalties = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
    answer = client.completions.create(model=MODEL, prompt="One, two, one, two,",
                                       temperature=0, max_tokens=16, **penalties)
    penalised = expected(served.llm, "One, two, one, two,", max_tokens=16, **penalties)
    plain = expected(served.llm, "One, two, one, two,", max_tokens=16)
    assert answer.choices[0].text == penalised.text
    assert penalised.text != plain.text  # the penalties changed the greedy text


def test_a_streamed_completion_equals_the_whole_one(client):
    whole = client.completions.create(prompt=PROMPTS[0], model=MODEL, **GREEDY)
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(prompt=PROMPTS[0], model=MODEL, stream=True,
                                           stream_options={"include_usage": True}, **GREEDY):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].text
    assert finish == whole.choices[0].finish_reason
    assert usage == whole.usage


def test_chat_equals_the_template_applied_then_generate(client, served):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                            temperature=0)
    reference = served.llm.chat(messages, hwplug.SamplingParams(max_tokens=16))
    assert answer.choices[0].message.content == reference.text
    assert answer.choices[0].message.role == "assistant"
    assert answer.usage.prompt_tokens == len(served.llm.apply_chat_template(messages))
    assert answer.usage.completion_tokens == len(reference.token_ids)


def test_async_streamed_chat_equals_the_whole_answer(served):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Name a color."}]}]

    async def both():
        async with async_client(served) as client:
            whole = await client.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=16, temperature=0)
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_completion_tokens=16, temperature=0,
                stream=True)
            chunks = [chunk async for chunk in stream]
        return whole, chunks

    whole, chunks = asyncio.run(both())
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_n_seeded_samples_stream_as_they_come_whole(client, served):
    sampling = {"n": 3, "temperature": 0.9, "top_p": 0.95, "seed": 7, "max_tokens": 10}
    top_k = {"top_k": 50}  # not an OpenAI parameter: the client sends it as extra_body
    whole = client.completions.create(model=MODEL, prompt=PROMPTS[0], extra_body=top_k,
                                      **sampling)
    reference = expected(served.llm, PROMPTS[0], **sampling, **top_k)
    assert [c.text for c in whole.choices] == [c.text for c in reference.outputs]
    texts = ["", "", ""]
    for chunk in client.completions.create(model=MODEL, prompt=PROMPTS[0], stream=True,
                                           extra_body=top_k, **sampling):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in whole.choices]


def test_stop_strings_and_stop_token_ids(client, served):
    free = expected(served.llm, PROMPTS[1], max_tokens=12)
    stop = free.text[4:7]
    answer = client.completions.create(model=MODEL, prompt=PROMPTS[1], stop=[stop], **GREEDY)
    choice = answer.choices[0]
    assert choice.text == free.text[:free.text.index(stop)]
    assert (choice.finish_reason, choice.model_extra["stop_reason"]) == ("stop", stop)
    token = free.token_ids[3]
    by_id = client.completions.create(model=MODEL, prompt=PROMPTS[1],
                                      extra_body={"stop_token_ids": [token]}, **GREEDY)
    assert by_id.usage.completion_tokens == free.token_ids.index(token) + 1
    assert by_id.choices[0].model_extra["stop_reason"] == token


def test_logprobs_are_generates_and_echo_prepends_the_prompt(client, served):
    answer = client.completions.create(model=MODEL, prompt=PROMPTS[0], logprobs=3, echo=True,
                                       **GREEDY)
    reference = expected(served.llm, PROMPTS[0], max_tokens=12, logprobs=3)
    choice = answer.choices[0]
    assert choice.text == PROMPTS[0] + reference.text
    prompt_length = len(served.llm.tokenize(PROMPTS[0]))
    logprobs = choice.logprobs
    assert logprobs.token_logprobs[0] is None  # nothing predicts the first prompt token
    generated = logprobs.token_logprobs[prompt_length:]
    assert generated == pytest.approx([row[token].logprob for row, token in
                                       zip(reference.logprobs, reference.token_ids, strict=True)],
                                      abs=1e-3)
    assert all(len(top) >= 3 for top in logprobs.top_logprobs[prompt_length:])
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True,
        top_logprobs=2, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)
    assert "".join(entry.token for entry in content).startswith(chat.choices[0].message.content)


def test_models_tokenize_detokenize_and_health(client, served):
    assert [model.id for model in client.models.list().data] == [MODEL]
    tokens = httpx.post(served.url + "/tokenize", json={"prompt": PROMPTS[0]}).json()
    assert tokens["tokens"] == served.llm.tokenize(PROMPTS[0])
    assert tokens["count"] == len(tokens["tokens"])
    text = httpx.post(served.url + "/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert text["prompt"].endswith(PROMPTS[0])
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}


def test_concurrent_streams_are_batched_and_each_gets_its_own_text(served):
    prompts = [f"Count from {i}:" for i in range(6)]
    before = metrics(served)["hwplug_engine_steps_total"]

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                                 **GREEDY)
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def everyone():
        async with async_client(served) as client:
            return await asyncio.gather(*(one(client, prompt) for prompt in prompts))

    texts = asyncio.run(everyone())
    steps = metrics(served)["hwplug_engine_steps_total"] - before
    assert texts == [expected(served.llm, p, max_tokens=12).text for p in prompts]
    assert steps < len(prompts) * GREEDY["max_tokens"]  # requests shared steps


def test_after_warm_up_a_burst_replays_step_graphs_and_records_none(served):
    """``hwplug serve`` warms its ``LLM`` up before answering (tests/test_serve_cli.py); after
    that ``/metrics`` counts every bucket recorded, and a burst of streams, whose batch
    grows through the buckets, replays every decode step."""
    graphs = served.llm.runner.graphs
    recorded = served.llm.warm_up()
    if graphs.refused:
        pytest.skip(f"this CPU replays no float decode step: {graphs.describe()}")
    assert recorded == [1, 2, 4]
    before = wait_until_idle(served)
    assert before["hwplug_step_graph_buckets"] == 3

    async def one(client: openai.AsyncOpenAI, prompt: str) -> str:
        stream = await client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                                 **GREEDY)
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    async def burst():
        async with async_client(served) as client:
            return await asyncio.gather(*(one(client, f"Item {i}:") for i in range(4)))

    texts = asyncio.run(burst())
    after = wait_until_idle(served)
    assert texts == [expected(served.llm, f"Item {i}:", max_tokens=12).text for i in range(4)]
    # 11 decode steps at least (12 tokens, the first from the prefill), none eager
    assert after["hwplug_replayed_steps_total"] - before["hwplug_replayed_steps_total"] >= 11
    assert after["hwplug_eager_decode_steps_total"] == before["hwplug_eager_decode_steps_total"]
    assert after["hwplug_step_graph_buckets"] == 3


def long_stream(client: httpx.Client, served, prompt: str):
    """A streamed request that would run for 2000 tokens, opened and read up to its
    first event (the engine is running it then); returns the response and its lines
    (dropping an unfinished line iterator closes the connection)."""
    response = client.send(client.build_request(
        "POST", served.api + "/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 2000, "ignore_eos": True,
            "temperature": 0, "stream": True}), stream=True)
    assert response.status_code == 200
    lines = response.iter_lines()
    assert next(line for line in lines if line).startswith('data: {"id"')
    return response, lines


def test_a_disconnect_mid_stream_frees_the_requests_blocks(served):
    wait_until_idle(served)
    with httpx.Client(timeout=60) as client:
        response, _lines = long_stream(client, served, PROMPTS[0])
        busy = metrics(served)
        assert busy["hwplug_kv_blocks_used"] > 0 and busy["hwplug_requests_in_flight"] == 1
        response.close()
    after = wait_until_idle(served)
    assert after["hwplug_generation_tokens_total"] - busy["hwplug_generation_tokens_total"] < 2000


def test_a_full_queue_answers_503_with_retry_after(served):
    wait_until_idle(served)
    with httpx.Client(timeout=60) as client:
        running_streams = [long_stream(client, served, f"Story {i}:")
                           for i in range(MAX_NUM_SEQS)]
        # queued requests are admitted without running yet: open them without reading
        queued = [client.send(client.build_request(
            "POST", served.api + "/completions", json={
                "model": MODEL, "prompt": "Queued", "max_tokens": 2000, "ignore_eos": True,
                "stream": True}), stream=True) for _ in range(MAX_QUEUED)]
        assert all(response.status_code == 200 for response in queued)
        refused = client.post(served.api + "/completions",
                              json={"model": MODEL, "prompt": "One more", "max_tokens": 1})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        assert metrics(served)["hwplug_queue_length"] == MAX_QUEUED
        for response in [response for response, _ in running_streams] + queued:
            response.close()
    wait_until_idle(served)


def test_the_api_key_is_required_except_for_health_and_metrics(serve_llm):
    with running(serve_llm, api_key=API_KEY) as server:
        anonymous = openai.OpenAI(base_url=server.api, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        assert httpx.post(server.url + "/tokenize", json={"prompt": "x"}).status_code == 401
        keyed = openai.OpenAI(base_url=server.api, api_key=API_KEY, max_retries=0)
        assert keyed.completions.create(model=MODEL, prompt="Hi", max_tokens=2).choices
        assert httpx.get(server.url + "/health").status_code == 200
        assert httpx.get(server.url + "/metrics").status_code == 200


def test_an_encoder_serves_embeddings_and_no_completions():
    encoder = hwplug.LLM("all-minilm-l6-v2")
    texts = ["The capital of France is Paris.", "A sentence about the sea."]
    try:
        with running(encoder, model_name="all-minilm-l6-v2") as server:
            client = openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0)
            # floats, then the client's default: base64, which it decodes
            for encoding in ({"encoding_format": "float"}, {}):
                answer = client.embeddings.create(model="all-minilm-l6-v2", input=texts,
                                                  **encoding)
                vectors = torch.tensor([item.embedding for item in answer.data])
                assert torch.allclose(vectors, encoder.embed(texts), atol=1e-5)
            assert answer.usage.prompt_tokens == sum(len(encoder.tokenizer(text).input_ids)
                                                     for text in texts)
            with pytest.raises(openai.BadRequestError, match="encoder"):
                client.completions.create(model="all-minilm-l6-v2", prompt="x")
    finally:
        encoder.close()
