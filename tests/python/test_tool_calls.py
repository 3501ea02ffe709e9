"""Tool calling through OpenAI's client: `tools`, `tool_choice`, `tool_calls` whole and
streamed, and `role: "tool"` turns fed back.

Qwen2.5-Coder-0.5B-Instruct (trained on Hermes' `<tool_call>` format) runs with vLLM's
`--enable-auto-tool-choice --tool-call-parser hermes`; `./scripts/test.sh` fetches it, and
its tests fail without it unless the developer opted out with MINIVLLM_SKIP=models. The forced choices (`required`, a named function) and the errors run on
the session's SmolLM2 server, whose template knows no tools: constrained decoding alone
makes its calls parse.
"""

import json
import re
import urllib.request

import jsonschema
import openai
import pytest

from conftest import TENSOR_PARALLEL, serve
from pytest_support import qwen_model


WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "The city name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def qwen(binary: str):
    if TENSOR_PARALLEL > 1:
        pytest.skip("Qwen2.5's 2 KV heads do not split over the suite's 3 ranks")
    server = serve([
        binary, "serve", "--model", qwen_model(), "--served-model-name", "qwen", "--port", "0",
        "--kv-cache-memory", "256MiB", "--max-model-len", "4096",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ])
    url = next(server)
    yield url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    server.close()


def check_calls(calls, names=None):
    """Every call has an id, a known name and arguments valid against its tool's schema."""
    assert calls, "no tool calls"
    for c in calls:
        assert c.id and c.type == "function"
        assert c.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def test_qwen_calls_a_tool_and_reads_its_result(qwen):
    url, client = qwen
    r = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                       temperature=0, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls, ["get_weather"])
    call = choice.message.tool_calls[0]
    assert json.loads(call.function.arguments)["city"] == "Paris"

    # The call and its result go back in the next turn, as an agent sends them.
    turn = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    # The template sees both, as Qwen's training wrote them.
    ids = post(url, "/tokenize", {"model": "qwen", "messages": turn, "tools": TOOLS})["tokens"]
    prompt = post(url, "/detokenize", {"model": "qwen", "tokens": ids})["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"' in prompt
    assert '<tool_response>\n{"temperature": 21, "sky": "sunny"}\n</tool_response>' in prompt
    assert '"name": "add", "description": "Add two integers"' in prompt
    r2 = client.chat.completions.create(model="qwen", messages=turn, tools=TOOLS,
                                        temperature=0, max_tokens=40)
    assert r2.usage.prompt_tokens == len(ids)
    message = r2.choices[0].message
    assert message.content or message.tool_calls


def test_qwen_streams_the_call_in_pieces_that_add_up_to_the_whole(qwen):
    _, client = qwen
    whole = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                           temperature=0, max_tokens=100)
    stream = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                            temperature=0, max_tokens=100, stream=True)
    calls, pieces, finish, content = {}, 0, None, ""
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for t in delta.tool_calls or []:
            if t.index not in calls:
                assert t.id and t.function.name, "a call's first piece names it"
                calls[t.index] = {"id": t.id, "name": t.function.name, "arguments": ""}
            calls[t.index]["arguments"] += t.function.arguments or ""
            pieces += 1
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert content == (whole.choices[0].message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert pieces > 3, "the arguments came in one piece"


def test_tool_choice_none_answers_in_text(qwen):
    _, client = qwen
    r = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                       tool_choice="none", temperature=0, max_tokens=30)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_choices_always_parse(client: openai.OpenAI, stream: bool):
    """SmolLM2 was never taught tools: the constraint alone makes its calls valid."""
    asks = ["What is 2 plus 3?", "Is it raining in Oslo?", "Hello!"]
    for i, content in enumerate(asks):
        for choice, names in [
            ("required", None),
            ({"type": "function", "function": {"name": "add"}}, ["add"]),
        ]:
            kw = dict(model="smol", messages=[{"role": "user", "content": content}],
                      tools=TOOLS, tool_choice=choice, max_tokens=120, seed=i, temperature=0.7)
            if not stream:
                r = client.chat.completions.create(**kw)
                choice_out = r.choices[0]
                assert choice_out.finish_reason == ("tool_calls" if choice == "required" else "stop")
                check_calls(choice_out.message.tool_calls, names)
                continue
            calls = {}
            for chunk in client.chat.completions.create(stream=True, **kw):
                for t in chunk.choices[0].delta.tool_calls or []:
                    c = calls.setdefault(t.index, {"id": t.id, "name": t.function.name, "args": ""})
                    c["args"] += t.function.arguments or ""
            assert calls
            for c in calls.values():
                assert c["id"] and c["name"] in (names or SCHEMAS)
                jsonschema.validate(json.loads(c["args"]), SCHEMAS[c["name"]])


def test_parallel_tool_calls_false_gives_one_call(client: openai.OpenAI):
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Weather in Oslo and Rome?"}],
        tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=120,
        temperature=0)
    assert len(r.choices[0].message.tool_calls) == 1


@pytest.mark.parametrize("extra, needle", [
    ({"tools": TOOLS}, "--enable-auto-tool-choice"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "--enable-auto-tool-choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "Tool 'nope' has not been passed in `tools`"),
    ({"tool_choice": "required"}, "`tools` must be set"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot be combined"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
     "parameters must be a JSON schema object"),
    ({"tools": TOOLS, "tool_choice": "none", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "add", "arguments": "{oops"}}]},
        {"role": "user", "content": "hi"}]},
     "arguments is not JSON"),
])
def test_bad_tool_requests_get_a_400_naming_the_problem(client: openai.OpenAI, extra, needle):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smol", **body)
    assert needle in str(e.value)


def test_qwen_structured_output_validates(qwen):
    """Constrained decoding over Qwen2.5's 151k-token byte-level vocabulary."""
    _, client = qwen
    schema = {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["big", "old", "coastal"]}, "maxItems": 3}},
        "required": ["city", "population"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "Describe Lyon as JSON."}],
        n=3, temperature=0.8, seed=2, max_tokens=100,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), schema)
    r = client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "A hex colour?"}], max_tokens=20,
        temperature=1.0, seed=3, extra_body={"structured_outputs": {"regex": "#[0-9a-f]{6}"}})
    assert re.fullmatch("#[0-9a-f]{6}", r.choices[0].message.content)


def test_qwen_auto_calls_that_start_always_parse(qwen):
    """With the Hermes parser, `auto` holds what follows `<tool_call>` to a call of one of
    the tools (a structural tag). A logit bias on `<tool_call>` (one token in Qwen2.5's
    vocabulary) makes the model open a call for a question no tool answers; the tool takes
    only integers, so the bias cannot put the token inside the call's strings."""
    url, client = qwen
    ids = post(url, "/tokenize", {"model": "qwen", "prompt": "<tool_call>",
                                  "add_special_tokens": False})["tokens"]
    assert len(ids) == 1
    r = client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "Write a haiku about rain."}],
        tools=TOOLS[1:], temperature=0, max_tokens=80, logit_bias={str(ids[0]): 100},
        stop=["</tool_call>"], extra_body={"include_stop_str_in_output": True})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    check_calls(choice.message.tool_calls, ["add"])


# Anthropic's Messages API: the same calls as `tool_use` blocks, `tool_result` fed back.
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


def anthropic_client(url: str):
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_qwen_calls_a_tool_through_anthropics_api_and_reads_its_result(qwen):
    url, client = qwen
    claude = anthropic_client(url)
    m = claude.messages.create(model="qwen", max_tokens=100, messages=ASK, tools=ANTHROPIC_TOOLS,
                               extra_body={"temperature": 0})
    chat = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                          temperature=0, max_tokens=100)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    calls = chat.choices[0].message.tool_calls
    assert [(u.name, u.input) for u in uses] == [
        (c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert uses[0].id.startswith("toolu_") and uses[0].input["city"] == "Paris"

    with claude.messages.stream(model="qwen", max_tokens=100, messages=ASK, tools=ANTHROPIC_TOOLS,
                                extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (u.name, u.input) for u in uses]

    turn = ASK + [
        {"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                          for b in uses]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": '{"temperature": 21, "sky": "sunny"}'}]},
    ]
    counted = claude.messages.count_tokens(model="qwen", messages=turn, tools=ANTHROPIC_TOOLS)
    openai_turn = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": uses[0].id, "type": "function",
             "function": {"name": uses[0].name, "arguments": json.dumps(uses[0].input)}}]},
        {"role": "tool", "tool_call_id": uses[0].id, "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    ids = post(url, "/tokenize", {"model": "qwen", "messages": openai_turn, "tools": TOOLS})["tokens"]
    assert counted.input_tokens == len(ids)
    reply = claude.messages.create(model="qwen", max_tokens=40, messages=turn,
                                   tools=ANTHROPIC_TOOLS, extra_body={"temperature": 0})
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == len(ids)
    assert reply.content


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_through_anthropics_api_always_parses(server_url, stream):
    claude = anthropic_client(server_url)
    kw = dict(model="smol", max_tokens=120, tools=ANTHROPIC_TOOLS,
              tool_choice={"type": "tool", "name": "add"},
              messages=[{"role": "user", "content": "What is 2 plus 3?"}])
    if stream:
        with claude.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and [u.name for u in uses] == ["add"]
    jsonschema.validate(uses[0].input, SCHEMAS["add"])


# OpenAI's Responses API: flat function tools, `function_call` items, their outputs fed back.
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]


def test_qwen_calls_a_tool_through_the_responses_api_and_reads_its_result(qwen):
    url, client = qwen
    r = client.responses.create(model="qwen", input=ASK, tools=FLAT_TOOLS, temperature=0,
                                max_output_tokens=100)
    chat = client.chat.completions.create(model="qwen", messages=ASK, tools=TOOLS,
                                          temperature=0, max_tokens=100)
    calls = [o for o in r.output if o.type == "function_call"]
    want = chat.choices[0].message.tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (w.function.name, json.loads(w.function.arguments)) for w in want]
    assert calls[0].id.startswith("fc_") and calls[0].call_id and calls[0].status == "completed"

    events = list(client.responses.create(model="qwen", input=ASK, tools=FLAT_TOOLS,
                                          temperature=0, max_output_tokens=100, stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(d.name, json.loads(d.arguments)) for d in done] == [
        (c.name, json.loads(c.arguments)) for c in calls]
    assert types[-1] == "response.completed"

    turn = [*ASK, *[c.model_dump(exclude_none=True) for c in calls],
            {"type": "function_call_output", "call_id": calls[0].call_id,
             "output": '{"temperature": 21, "sky": "sunny"}'}]
    reply = client.responses.create(model="qwen", input=turn, tools=FLAT_TOOLS, temperature=0,
                                    max_output_tokens=40)
    openai_turn = ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": calls[0].call_id, "type": "function",
             "function": {"name": calls[0].name, "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id,
         "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    ids = post(url, "/tokenize", {"model": "qwen", "messages": openai_turn, "tools": TOOLS})["tokens"]
    assert reply.usage.input_tokens == len(ids)
    assert reply.output


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_tool_choice_through_the_responses_api_always_parses(client, stream):
    kw = dict(model="smol", input="What is 2 plus 3?", tools=FLAT_TOOLS, max_output_tokens=120,
              tool_choice={"type": "function", "name": "add"})
    if stream:
        with client.responses.stream(**kw) as s:
            r = s.get_final_response()
    else:
        r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["add"]
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["add"])
