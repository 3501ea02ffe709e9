"""Structured output through OpenAI's own client: `response_format` (also through the
client's `parse` with a pydantic model), vLLM's `structured_outputs` and the older
`guided_*` fields, each output checked independently (the `jsonschema` package, Python's
`re`), and constraints that do not compile refused with a 400 naming the problem.
"""

import json
import re

import jsonschema
import openai
import pydantic
import pytest

from conftest import SERVED_MODEL_NAME, TENSOR_PARALLEL

QUESTION = [{"role": "user", "content": "Describe a city as JSON."}]

# Varied schemas: nested objects, arrays with bounds, enums, bounded numbers, string
# formats, anyOf, $ref. Strings and integers are bounded so that a sampled completion ends in
# time (at temperature 1 SmolLM2 may write digits until max_tokens).
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
     "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}, "required": ["name", "population"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "minItems": 1, "maxItems": 3,
     "items": {"type": "string", "maxLength": 8}}}, "required": ["tags"],
     "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
     "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01}},
     "required": ["colour", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date"},
     "ok": {"type": "boolean"}}, "required": ["when", "ok"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": -999, "maximum": 999},
     {"type": "string", "maxLength": 10}]}}, "required": ["value"],
     "additionalProperties": False},
    {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "maximum": 999,
     "minimum": -999}, "y": {"type": "integer", "minimum": -999, "maximum": 999}}, "required": ["x", "y"], "additionalProperties": False}},
     "type": "object", "properties": {"a": {"$ref": "#/$defs/point"},
     "b": {"$ref": "#/$defs/point"}}, "required": ["a", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {
     "depth": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["depth"],
     "additionalProperties": False}}, "required": ["inner"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
     "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"todo": {"type": "array", "minItems": 1, "maxItems": 2,
     "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1,
     "maximum": 99}, "done": {"type": "boolean"}}, "required": ["id", "done"],
     "additionalProperties": False}}}, "required": ["todo"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string",
     "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"kind": {"const": "point"}, "n": {"type": "integer",
     "exclusiveMinimum": 0, "maximum": 10}}, "required": ["kind", "n"],
     "additionalProperties": False},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}},
     "required": ["id"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9999}, "b": {"type": "string",
     "maxLength": 5}}, "required": ["a"], "additionalProperties": False},
]
CITY_QUESTIONS = [QUESTION, [{"role": "user", "content": "Give me some data as JSON."}]]
# One process: 13 schemas x 2 prompts x n=8, 208 outputs; the 3-rank run, a quarter.
N = 8 if TENSOR_PARALLEL == 1 else 4
QUESTIONS = CITY_QUESTIONS if TENSOR_PARALLEL == 1 else CITY_QUESTIONS[:1]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_json_schema_outputs_validate(client: openai.OpenAI, schema: dict):
    """Every output of the corpus parses and validates, formats (date, uuid) checked too."""
    for i, question in enumerate(QUESTIONS):
        r = client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=question, n=N, temperature=1.0, seed=1 + i,
            max_tokens=200,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": schema, "strict": True}},
        )
        assert len(r.choices) == N
        for c in r.choices:
            assert c.finish_reason == "stop", c.message.content
            jsonschema.validate(json.loads(c.message.content), schema,
                                format_checker=jsonschema.FormatChecker())


def test_completions_take_response_format_and_structured_outputs(client: openai.OpenAI):
    schema = SCHEMAS[0]
    r = client.completions.create(
        model=SERVED_MODEL_NAME, prompt="A city as JSON:", max_tokens=200, n=3,
        temperature=1.0, seed=2,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "city", "schema": schema}}},
    )
    for c in r.choices:
        jsonschema.validate(json.loads(c.text), schema)
    rx = r"[A-Z][a-z]{2,8}, [0-9]{4}"
    r = client.completions.create(
        model=SERVED_MODEL_NAME, prompt="A city and a year:", max_tokens=40, n=3,
        temperature=1.0, seed=3, extra_body={"structured_outputs": {"regex": rx}},
    )
    for c in r.choices:
        assert re.fullmatch(rx, c.text), c.text


def test_guided_fields_and_json_object(client: openai.OpenAI):
    choices = ["Paris", "Berlin", "Rome"]
    r = client.chat.completions.create(
        model=SERVED_MODEL_NAME, messages=QUESTION, n=4, temperature=1.0, seed=4,
        extra_body={"guided_choice": choices},
    )
    assert all(c.message.content in choices for c in r.choices)
    # Any object: nothing bounds its length but the model, so a prompt it copies from.
    r = client.completions.create(
        model=SERVED_MODEL_NAME, prompt='Copy: {"ok": true, "n": 1}\nCopy:', temperature=0,
        max_tokens=100, extra_body={"response_format": {"type": "json_object"}},
    )
    assert r.choices[0].finish_reason == "stop", r.choices[0].text
    assert json.loads(r.choices[0].text) == {"ok": True, "n": 1}


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)
    capital: bool


def test_parse_with_a_pydantic_model_and_streaming(client: openai.OpenAI):
    r = client.chat.completions.parse(
        model=SERVED_MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=200,
        response_format=City,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City)
    # The schema `parse` sends (strict: no keys beyond City's), so both runs are constrained
    # alike; without it the greedy reply may invent keys until max_tokens.
    strict = {**City.model_json_schema(), "additionalProperties": False}
    stream = client.chat.completions.create(
        model=SERVED_MODEL_NAME, messages=QUESTION, temperature=0, max_tokens=200,
        stream=True, response_format={"type": "json_schema", "json_schema": {
            "name": "City", "schema": strict, "strict": True}},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert City.model_validate_json(text) == city


@pytest.mark.parametrize("extra, needle", [
    ({"structured_outputs": {"regex": "(unclosed"}}, "invalid regex"),
    ({"guided_json": {"type": "no such type"}}, "invalid JSON schema"),
    ({"structured_outputs": {"grammar": "start: missing_rule"}}, "invalid grammar"),
    ({"guided_choice": []}, "at least one"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "more than one field"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "multiple are specified"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structural_tag is not a valid tag"),
])
def test_bad_constraints_get_a_400_naming_the_problem(client: openai.OpenAI, extra, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=QUESTION, max_tokens=5, extra_body=extra)
    assert needle in str(e.value), str(e.value)


def test_structural_tag_holds_what_follows_its_trigger(client: openai.OpenAI, server_url: str):
    """vLLM's `structural_tag`: free text, but after the trigger `<` only `<add>`, JSON of
    the schema and `</add>`. A logit bias makes SmolLM2 write the trigger first."""
    import urllib.request

    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
              "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["a", "b"], "additionalProperties": False}
    tag = {"type": "structural_tag", "triggers": ["<"],
           "structures": [{"begin": "<add>", "schema": schema, "end": "</add>"}]}
    req = urllib.request.Request(f"{server_url}/tokenize", data=json.dumps(
        {"prompt": "<", "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        bias = {str(i): 100 for i in json.load(r)["tokens"]}
    for body in ({"structured_outputs": {"structural_tag": json.dumps(tag)}},
                 {"response_format": tag}):
        r = client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=[{"role": "user", "content": "Add 2 and 3."}],
            max_tokens=60, temperature=0, logit_bias=bias, stop=["</add>"],
            extra_body={"include_stop_str_in_output": True, **body})
        text = r.choices[0].message.content
        m = re.fullmatch(r"<add>\s*(\{.*\})\s*</add>", text, re.S)
        assert m, text
        jsonschema.validate(json.loads(m.group(1)), schema)
    bad = dict(tag, triggers=["<", "["])
    with pytest.raises(openai.BadRequestError, match="begins no structure"):
        client.chat.completions.create(
            model=SERVED_MODEL_NAME, messages=QUESTION, max_tokens=5,
            extra_body={"structured_outputs": {"structural_tag": json.dumps(bad)}})
