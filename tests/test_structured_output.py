"""Structured output: the engine masks tokens so the text stays in a JSON schema, any JSON
object, a regex or a grammar (llguidance), from ``LLM.generate`` and from ``hwplug serve``.

Sampled (temperature 1, seeded) so that without the mask the model would wander off: every
completion must still parse, validate against its schema with ``jsonschema`` and end on
its own (finish reason ``stop``, well before ``max_tokens``); 20 different prompts go
through the server's chat API (the ``openai`` client, ``response_format`` json_schema).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

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
#: A short schema for the many-prompts test (about 15 tokens of JSON).
PET = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
    "required": ["name", "legs"], "additionalProperties": False}
#: 20 different prompts, each sent once through the server with :data:`PET` as its schema.
PET_PROMPTS = [f"Describe {animal} as JSON." for animal in (
    "a cat", "a dog", "a spider", "a snake", "a parrot", "a horse", "an ant", "a fish",
    "a cow", "an octopus", "a bird", "a lizard", "a frog", "a crab", "a bee", "a mouse",
    "a goat", "a whale", "a duck", "a beetle")]


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


def test_twenty_prompts_through_the_server_each_validate(served):
    """20 distinct chat prompts, 4 at a time, each with ``response_format`` json_schema:
    every answer parses, validates against the schema and ends on its own."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.api, api_key="unused", max_retries=0)
    assert len(set(PET_PROMPTS)) == 20

    def ask(prompt: str) -> tuple[str, str]:
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=1.0,
            seed=7, max_tokens=40, response_format={
                "type": "json_schema", "json_schema": {"name": "pet", "schema": PET}})
        return answer.choices[0].finish_reason, answer.choices[0].message.content

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, PET_PROMPTS))
    for prompt, (finish_reason, content) in zip(PET_PROMPTS, answers, strict=True):
        assert finish_reason == "stop", (prompt, content)
        jsonschema.validate(json.loads(content), PET)
