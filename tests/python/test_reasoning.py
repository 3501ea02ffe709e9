"""`--reasoning-parser`: chat replies' thinking in `message.reasoning_content` (streamed as
`delta.reasoning_content`), and structured output constraining only the answer after it.

SmolLM2 is no reasoning model: a chat template that opens `<think>` at the end of the prompt
(as DeepSeek-R1's does) makes whatever it writes thinking, and a logit bias towards the
tokens of `</think>` makes it close the thinking at once, so the constraint's part shows.
"""

import re

import openai
import pytest

from conftest import serve

# SmolLM2's template with R1's opened thinking after the generation prompt.
TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)
ASK = [{"role": "user", "content": "Tell me about cats."}]


@pytest.fixture(scope="module")
def thinking(binary: str, model: str):
    server = serve([
        binary, "serve", "--model", model, "--served-model-name", "smol", "--port", "0",
        "--kv-cache-memory", "64MiB", "--max-model-len", "1024",
        "--reasoning-parser", "deepseek_r1", "--chat-template", TEMPLATE,
    ])
    url = next(server)
    yield url, openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    server.close()


def test_thinking_goes_in_reasoning_content_whole_and_streamed(thinking):
    _, client = thinking
    r = client.chat.completions.create(model="smol", messages=ASK, max_tokens=16, temperature=0)
    message = r.choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert thought and message.content is None
    assert r.choices[0].finish_reason == "length"
    pieces, content = [], ""
    for chunk in client.chat.completions.create(model="smol", messages=ASK, max_tokens=16,
                                                temperature=0, stream=True):
        delta = chunk.choices[0].delta
        pieces.append((delta.model_extra or {}).get("reasoning_content") or "")
        content += delta.content or ""
    assert "".join(pieces) == thought and content == ""
    assert sum(1 for p in pieces if p) > 3


def close_thinking_bias(url: str) -> dict:
    import json
    import urllib.request

    req = urllib.request.Request(f"{url}/tokenize", data=json.dumps(
        {"model": "smol", "prompt": "</think>", "add_special_tokens": False}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        ids = json.load(r)["tokens"]
    return {str(i): 100 for i in ids}


def test_structured_output_constrains_only_the_answer(thinking):
    url, client = thinking
    body = dict(model="smol", messages=ASK, max_tokens=12, temperature=0,
                extra_body={"structured_outputs": {"regex": "[0-9]{3}"}})
    # Thinking is free: the constraint has not started.
    free = client.chat.completions.create(**body).choices[0].message
    assert re.search("[a-zA-Z]", free.model_extra["reasoning_content"])
    # Once `</think>` is written, the answer follows the constraint.
    body["logit_bias"] = close_thinking_bias(url)
    answered = client.chat.completions.create(**body).choices[0]
    assert re.fullmatch("[0-9]{3}", answered.message.content), answered.message
    assert answered.finish_reason == "stop"


def test_thinking_in_anthropics_and_the_responses_apis(thinking):
    url, client = thinking
    chat = client.chat.completions.create(model="smol", messages=ASK, max_tokens=16, temperature=0)
    thought = chat.choices[0].message.model_extra["reasoning_content"]

    anthropic = pytest.importorskip("anthropic")
    claude = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    m = claude.messages.create(model="smol", max_tokens=16, messages=ASK,
                               extra_body={"temperature": 0})
    assert [(b.type, b.thinking) for b in m.content] == [("thinking", thought)]
    assert m.stop_reason == "max_tokens"
    with claude.messages.stream(model="smol", max_tokens=16, messages=ASK,
                                extra_body={"temperature": 0}) as stream:
        pieces = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert "".join(pieces) == thought and len(pieces) > 3
    assert [b.type for b in final.content] == ["thinking"]

    r = client.responses.create(model="smol", input=ASK, max_output_tokens=16, temperature=0)
    assert [o.type for o in r.output] == ["reasoning"] and r.status == "incomplete"
    assert r.output[0].content[0].text == thought and r.output_text == ""
    events = list(client.responses.create(model="smol", input=ASK, max_output_tokens=16,
                                          temperature=0, stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == thought
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].content[0].text == thought
