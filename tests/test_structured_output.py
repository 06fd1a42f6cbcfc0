"""Structured output: the engine masks tokens so the text stays in a JSON schema, any JSON
object, a regex or a grammar (llguidance), from ``LLM.generate`` and from ``hwplug serve``.

Sampled (temperature 1, seeded) so that without the mask the model would wander off: every
completion must still parse, validate against its schema with ``jsonschema`` and end on
its own (finish reason ``stop``, well before ``max_tokens``).
"""

from __future__ import annotations

import json
import re

import pytest
from serve_harness import MODEL

import hwplug
from hwplug.errors import ConfigError
from hwplug.model_zoo.sampling import StructuredOutput

pytestmark = pytest.mark.slow  # loads the real model
pytest.importorskip("llguidance", reason="structured output needs llguidance")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3}},
    "required": ["name", "age", "pets"], "additionalProperties": False}
PROMPT = "Describe a person as JSON:"


def sampled(structured: StructuredOutput, n: int = 2) -> hwplug.SamplingParams:
    """Sampled freely: only the mask keeps the text in its language (the JSON of
    :data:`PERSON` takes about 30 tokens)."""
    return hwplug.SamplingParams(max_tokens=60, temperature=1.0, seed=5, n=n,
                                 structured=structured)


def test_every_sample_validates_against_the_json_schema(serve_llm):
    output = serve_llm.generate(PROMPT, sampled(StructuredOutput(
        json_schema=json.dumps(PERSON))))[0]
    for completion in output.outputs:
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), PERSON)


def test_json_object_regex_and_grammar(serve_llm):
    anything = serve_llm.generate(PROMPT, hwplug.SamplingParams(
        max_tokens=60, structured=StructuredOutput(json_object=True)))[0]
    assert isinstance(json.loads(anything.text), dict)
    phone = serve_llm.generate("Call me at", sampled(StructuredOutput(
        regex=r" [0-9]{3}-[0-9]{4}")))[0]
    assert all(re.fullmatch(r" [0-9]{3}-[0-9]{4}", c.text) for c in phone.outputs)
    answer = serve_llm.generate("Is the sky blue?", sampled(StructuredOutput(
        grammar='start: " " ("yes" | "no")')))[0]
    assert {c.text for c in answer.outputs} <= {" yes", " no"}


def test_an_invalid_constraint_is_refused_before_it_runs(serve_llm):
    with pytest.raises(ConfigError, match="structured output"):
        serve_llm.generate(PROMPT, sampled(StructuredOutput(regex="[0-9")))
    with pytest.raises(ConfigError, match="exactly one"):
        StructuredOutput(regex="a", grammar="start: a")


def test_the_server_answers_response_format(served):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Invent a person."}]
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, n=2, seed=1, temperature=1.0, max_tokens=60,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON}})
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content), PERSON)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=60, stream=True,
        response_format={"type": "json_object"})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert isinstance(json.loads(text), dict)
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(model=MODEL, messages=messages,
                                       response_format={"type": "json_schema"})
