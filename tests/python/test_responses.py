"""OpenAI's Responses API (`POST /v1/responses`) through the official `openai` client, with
its strict response validation, against the session's SmolLM2 server: the chat route's
reply as output items, whole and streamed, structured output through `responses.parse`,
and the refusals of a server that keeps no responses. Tool calls: test_tool_calls.py.
"""

import openai
import pytest
from pydantic import BaseModel

from conftest import SERVED_MODEL_NAME as MODEL

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def strict(server_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0,
                         timeout=120, _strict_response_validation=True)


def test_a_response_is_the_chat_routes_reply(strict, client):
    r = strict.responses.create(model=MODEL, input=QUESTION, instructions="Be brief.",
                                temperature=0, max_output_tokens=40)
    chat = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=40,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}])
    assert r.id.startswith("resp_") and r.object == "response" and r.model == MODEL
    assert r.status == "completed" and r.incomplete_details is None
    assert [o.type for o in r.output] == ["message"]
    assert r.output[0].id.startswith("msg_") and r.output[0].status == "completed"
    assert r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                             chat.usage.completion_tokens)
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert (r.instructions, r.max_output_tokens, r.temperature) == ("Be brief.", 40, 0)


def test_the_stream_adds_up_to_the_whole_response(strict):
    kw = dict(model=MODEL, input=QUESTION, instructions="Be brief.", temperature=0,
              max_output_tokens=40)
    whole = strict.responses.create(**kw)
    events = list(strict.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(d.delta for d in deltas) == whole.output_text
    item_id = events[2].item.id
    assert all(d.item_id == item_id and d.output_index == 0 for d in deltas)
    final = events[-1].response
    assert final.id == events[0].response.id and final.output[0].id == item_id
    assert final.output_text == whole.output_text
    assert (final.usage.input_tokens, final.usage.output_tokens) == (whole.usage.input_tokens,
                                                                     whole.usage.output_tokens)
    # The second time, the prompt was in the prefix cache.
    assert final.usage.input_tokens_details.cached_tokens > 0

    with strict.responses.stream(**kw) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        assert stream.get_final_response().output_text == "".join(texts) == whole.output_text


def test_output_text_logprobs_when_included(strict, client):
    kw = dict(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=12)
    r = strict.responses.create(include=["message.output_text.logprobs"], top_logprobs=2, **kw)
    chat = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=12, logprobs=True, top_logprobs=2,
        messages=[{"role": "user", "content": QUESTION}])
    lps = r.output[0].content[0].logprobs
    want = chat.choices[0].logprobs.content
    assert [(x.token, x.logprob) for x in lps] == [(x.token, x.logprob) for x in want]
    assert all(len(x.top_logprobs) == 2 and x.top_logprobs[0].logprob >= x.logprob for x in lps)
    assert "".join(x.token for x in lps) == r.output_text
    assert r.top_logprobs == 2
    # Streamed: each delta carries its tokens', the done event all of them.
    events = list(strict.responses.create(stream=True, include=["message.output_text.logprobs"],
                                          top_logprobs=2, **kw))
    streamed = [x for e in events if e.type == "response.output_text.delta" for x in e.logprobs]
    assert [(x.token, x.logprob) for x in streamed] == [(x.token, x.logprob) for x in lps]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [x.token for x in done.logprobs] == [x.token for x in lps]
    # Not asked for: none.
    assert strict.responses.create(**kw).output[0].content[0].logprobs == []


def test_max_output_tokens_leaves_it_incomplete(strict):
    r = strict.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    last = list(strict.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                        max_output_tokens=3, stream=True))[-1]
    assert last.type == "response.incomplete"
    assert last.response.output_text == r.output_text


def test_input_items_and_an_earlier_output_carry_the_conversation(strict, client):
    first = strict.responses.create(model=MODEL, input=QUESTION, temperature=0,
                                    max_output_tokens=30)
    follow = [{"role": "developer", "content": "Answer in one word."},
              {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
              *[o.model_dump(exclude_none=True) for o in first.output],
              {"type": "message", "role": "user", "content": "And of Germany?"}]
    r = strict.responses.create(model=MODEL, input=follow, temperature=0, max_output_tokens=30)
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=30, messages=[
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And of Germany?"}])
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


class City(BaseModel):
    name: str
    country: str
    model_config = {"extra": "forbid"}


def test_structured_output_through_parse(strict):
    r = strict.responses.parse(model=MODEL, input="Name a city in Italy.", text_format=City,
                               temperature=0, max_output_tokens=60)
    assert isinstance(r.output_parsed, City) and r.output_parsed.name


@pytest.mark.parametrize("extra, param", [
    ({"previous_response_id": "resp_abc"}, "previous_response_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"background": True}, "background"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
     "input"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input"),
    ({"input": 5}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": {"type": "mcp"}, "tools": []}, "tool_choice"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ({"temperature": "hot"}, "temperature"),
])
def test_bad_requests_get_a_400_naming_the_field(strict, extra, param):
    body = {"input": QUESTION, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        strict.responses.create(model=MODEL, **body)
    assert e.value.param == param, e.value.body


def test_nothing_is_kept(strict):
    with pytest.raises(openai.NotFoundError):
        strict.responses.retrieve("resp_123")
    with pytest.raises(openai.NotFoundError):
        strict.responses.create(model="gpt-5", input=QUESTION)
