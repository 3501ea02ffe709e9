"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) through
Anthropic's own Python SDK, against the session's SmolLM2 server: the same reply as the chat
route gives, whole and streamed, with Anthropic's stop reasons, usage and errors.

SDK 2.x takes sampling settings it no longer lists (`temperature`, `top_k`) in `extra_body`.
Tool use (`tools`, `tool_use`, `tool_result`) is tested with Qwen in test_tool_calls.py.
"""

import json
import urllib.error
import urllib.request

import anthropic
import pytest

from conftest import SERVED_MODEL_NAME as MODEL

ASK = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def claude(server_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server_url, api_key="unused", max_retries=0, timeout=120)


def chat_reply(client, messages, max_tokens=40, **kw):
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens,
                                       temperature=0, **kw)
    return r.choices[0], r.usage


def test_a_message_is_the_chat_routes_reply(claude, client):
    m = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, system="Be brief.",
                               extra_body=GREEDY)
    choice, usage = chat_reply(client, [{"role": "system", "content": "Be brief."}, *ASK])
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == MODEL
    assert [b.type for b in m.content] == ["text"]
    assert m.content[0].text == choice.message.content
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[choice.finish_reason]
    assert m.stop_sequence is None
    # As Anthropic counts: the prompt is input_tokens + cache reads (+ cache writes, none).
    u = m.usage
    assert u.input_tokens + u.cache_read_input_tokens == usage.prompt_tokens
    assert u.cache_creation_input_tokens == 0 and u.output_tokens == usage.completion_tokens
    counted = claude.messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    assert counted.input_tokens == usage.prompt_tokens


def test_prefix_cache_hits_are_cache_reads(claude):
    system = "You answer questions about European geography in one short sentence. " * 6
    first = claude.messages.create(model=MODEL, max_tokens=2, messages=ASK, system=system,
                                   extra_body=GREEDY).usage
    # The second finds the first's full blocks in the prefix cache; the stream's final usage
    # (its message_delta) says so too.
    with claude.messages.stream(model=MODEL, max_tokens=2, messages=ASK, system=system,
                                extra_body=GREEDY) as stream:
        second = stream.get_final_message().usage
    prompt = first.input_tokens + first.cache_read_input_tokens
    assert prompt > 80
    assert second.input_tokens + second.cache_read_input_tokens == prompt
    assert second.cache_read_input_tokens >= 64, second


def test_the_stream_adds_up_to_the_whole_message(claude):
    whole = claude.messages.create(model=MODEL, max_tokens=30, messages=ASK, extra_body=GREEDY)
    with claude.messages.stream(model=MODEL, max_tokens=30, messages=ASK,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1, pieces
    assert "".join(pieces) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens

    # The events as sent, in Anthropic's order.
    events = [e.type for e in claude.messages.create(
        model=MODEL, max_tokens=30, messages=ASK, extra_body=GREEDY, stream=True)]
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}


def test_stop_sequences_and_max_tokens_give_anthropics_stop_reasons(claude):
    whole = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK, extra_body=GREEDY)
    text = whole.content[0].text
    word = text.split()[2]
    stopped = claude.messages.create(model=MODEL, max_tokens=40, messages=ASK,
                                     stop_sequences=["zzz", word], extra_body=GREEDY)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert stopped.content[0].text == text[:text.index(word)]
    with claude.messages.stream(model=MODEL, max_tokens=40, messages=ASK, stop_sequences=[word],
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", word)

    cut = claude.messages.create(model=MODEL, max_tokens=3, messages=ASK, extra_body=GREEDY)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


def test_a_final_assistant_turn_is_continued(claude, client):
    prefill = "The capital of France is"
    m = claude.messages.create(model=MODEL, max_tokens=10, extra_body=GREEDY, messages=[
        *ASK, {"role": "assistant", "content": prefill}])
    choice, _ = chat_reply(client, [*ASK, {"role": "assistant", "content": prefill}],
                           max_tokens=10, extra_body={"continue_final_message": True,
                                                      "add_generation_prompt": False})
    assert m.content[0].text == choice.message.content
    assert "Paris" in prefill + m.content[0].text


def test_content_blocks_and_sampling_settings_are_read(claude):
    blocks = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]
    m = claude.messages.create(model=MODEL, max_tokens=20, messages=[
        {"role": "user", "content": blocks}], extra_body={"temperature": 0.7, "top_k": 5,
                                                          "top_p": 0.9})
    assert m.content[0].text


def raw(url: str, body: dict, headers=None):
    req = urllib.request.Request(f"{url}/v1/messages", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.parametrize("body, names", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 0, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "'user' or 'assistant'"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}, "`image`"),
    ({"max_tokens": 5, "messages": ASK, "tools": [{"type": "web_search_20250305",
                                                   "name": "web_search"}]}, "input_schema"),
    ({"max_tokens": 5, "messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": "five", "messages": ASK}, "max_tokens"),
    ({"max_tokens": 5, "messages": ASK, "system": 3}, "system"),
])
def test_bad_requests_get_anthropics_error_naming_the_field(server_url, body, names):
    status, err = raw(server_url, {"model": MODEL, **body})
    assert status == 400, err
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert names in err["error"]["message"], err


def test_the_sdk_raises_its_own_exceptions(claude):
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-opus", max_tokens=5, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=MODEL, max_tokens=5, messages=[])
