"""`minivllm serve` spoken to with OpenAI's own Python client.

Every test checks the answers themselves: greedy texts against `minivllm generate`, streams
against the same request unstreamed, usage against the tokens actually returned.
"""

import asyncio
import json
import re
import subprocess

import openai
import pytest

from conftest import MAX_MODEL_LEN, SERVED_MODEL_NAME

PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]
GREEDY = dict(model=SERVED_MODEL_NAME, temperature=0)


@pytest.fixture(scope="module")
def generated(binary: str, model: str) -> dict:
    """`minivllm generate --json` on PROMPT: the offline engine's greedy answer."""
    out = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", PROMPT, "--max-tokens", "16", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.splitlines()
    return json.loads(line)


@pytest.fixture(scope="module")
def completion(client: openai.OpenAI):
    """The greedy completion of PROMPT, 16 tokens; several tests compare against it."""
    return client.completions.create(prompt=PROMPT, max_tokens=16, **GREEDY)


@pytest.fixture(scope="module")
def chat(client: openai.OpenAI):
    return client.chat.completions.create(messages=QUESTION, max_tokens=200, **GREEDY)


def check_usage(usage, prompt_tokens: int, completion_tokens: int):
    assert usage.prompt_tokens == prompt_tokens
    assert usage.completion_tokens == completion_tokens
    assert usage.total_tokens == prompt_tokens + completion_tokens


def test_models(client: openai.OpenAI):
    assert [m.id for m in client.models.list().data] == [SERVED_MODEL_NAME]


def test_completion_greedy_matches_generate(completion, generated: dict):
    (choice,) = completion.choices
    expected = generated["outputs"][0]
    assert choice.text and choice.text == expected["text"]
    assert choice.index == 0
    assert choice.finish_reason == "length"
    assert completion.object == "text_completion"
    assert completion.model == SERVED_MODEL_NAME
    check_usage(completion.usage, len(generated["prompt_token_ids"]), 16)


def test_chat_greedy(chat):
    (choice,) = chat.choices
    assert choice.message.role == "assistant"
    assert "Berlin" in choice.message.content
    # A short answer well within 200 tokens: the model ends it itself.
    assert choice.finish_reason == "stop"
    assert chat.object == "chat.completion"
    usage = chat.usage
    assert 0 < usage.completion_tokens < 200
    assert usage.prompt_tokens > len(QUESTION[0]["content"].split())  # the template's tokens too
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completion_stream_matches_unstreamed(client: openai.OpenAI, completion):
    stream = client.completions.create(
        prompt=PROMPT, max_tokens=16, stream=True, stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in with_choices) == completion.choices[0].text
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert with_choices[-1].choices[0].finish_reason == "length"
    # The usage chunk comes last, without choices, and counts what the unstreamed one did.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage == completion.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_matches_unstreamed(client: openai.OpenAI, chat):
    stream = client.chat.completions.create(
        messages=QUESTION, max_tokens=200, stream=True, stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == chat.choices[0].message.content
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage == chat.usage
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_n2_sampled(client: openai.OpenAI):
    kwargs = dict(
        model=SERVED_MODEL_NAME, prompt="Once upon a time", n=2, temperature=0.8, seed=1234,
        max_tokens=12, logprobs=1,
    )
    r = client.completions.create(**kwargs)
    assert sorted(c.index for c in r.choices) == [0, 1]
    for c in r.choices:
        assert c.finish_reason in ("stop", "length")
        assert c.text
        assert 1 <= len(c.logprobs.tokens) <= 12
        assert "".join(c.logprobs.tokens) == c.text
    counted = sum(len(c.logprobs.tokens) for c in r.choices)
    assert r.usage.completion_tokens == counted
    assert r.usage.total_tokens == r.usage.prompt_tokens + counted
    # Two samples, not one twice; and the seed makes the request repeatable.
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert texts[0] != texts[1]
    again = client.completions.create(**kwargs)
    assert [c.text for c in sorted(again.choices, key=lambda c: c.index)] == texts


def test_n2_chat_ignore_eos(client: openai.OpenAI):
    r = client.chat.completions.create(
        model=SERVED_MODEL_NAME, messages=QUESTION, n=2, temperature=0.8, seed=7, max_tokens=8,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.finish_reason == "length" and c.message.content for c in r.choices)
    assert r.usage.completion_tokens == 2 * 8


N2_STREAMED = dict(
    model=SERVED_MODEL_NAME, prompt="Hi", n=2, temperature=1.0, seed=5, max_tokens=40, stop=["."]
)


@pytest.fixture(scope="module")
def n2_stream(client: openai.OpenAI):
    """N2_STREAMED unstreamed, and its stream's chunks. With this seed choice 1 stops at a
    period long before choice 0 does."""
    full = client.completions.create(**N2_STREAMED)
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **N2_STREAMED)
    )
    return full, chunks


def test_n2_stream_matches_unstreamed(n2_stream):
    full, chunks = n2_stream
    assert sorted(len(c.text) for c in full.choices)[0] < max(len(c.text) for c in full.choices)
    for choice in full.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        first_finish = next(i for i, c in enumerate(mine) if c.finish_reason)
        assert mine[first_finish].finish_reason == choice.finish_reason
        assert all(c.text == "" for c in mine[first_finish + 1 :])
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage


def test_n2_stream_finishes_each_choice_once(n2_stream):
    _, chunks = n2_stream
    finishes = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1]


def stop_word(text: str) -> str:
    """A word from the middle of `text` that does not occur before it."""
    words = [m for m in re.finditer(r"[A-Za-z]{3,}", text) if text.find(m.group()) == m.start()]
    assert words, f"no word to stop at in {text!r}"
    return words[len(words) // 2].group()


def test_stop_string(client: openai.OpenAI, completion):
    full = completion.choices[0].text
    word = stop_word(full)
    cut = full[: full.index(word)]
    r = client.completions.create(prompt=PROMPT, max_tokens=16, stop=[word], **GREEDY)
    assert r.choices[0].text == cut
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra.get("stop_reason") == word  # vLLM's extra field
    assert r.usage.completion_tokens < 16

    r = client.completions.create(
        prompt=PROMPT, max_tokens=16, stop=word, extra_body={"include_stop_str_in_output": True},
        **GREEDY,
    )
    assert r.choices[0].text == cut + word
    assert r.choices[0].finish_reason == "stop"


def test_completion_logprobs(client: openai.OpenAI, completion):
    r = client.completions.create(prompt=PROMPT, max_tokens=16, logprobs=3, **GREEDY)
    (c,) = r.choices
    assert c.text == completion.choices[0].text
    lp = c.logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n == 16
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    for token, token_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3
        assert token_lp <= 0 and all(x <= 0 for x in top.values())
        # Greedy: the chosen token is the best, and comes first.
        assert list(top.values()) == sorted(top.values(), reverse=True)
        assert next(iter(top)) == token
        assert top[token] == pytest.approx(token_lp)
    # Sampled: vLLM's order, the chosen token first (in the top 3 or not), then the others
    # best first.
    r = client.completions.create(
        model=SERVED_MODEL_NAME, prompt=PROMPT, max_tokens=16, logprobs=3, temperature=1.5, seed=3
    )
    lp = r.choices[0].logprobs
    assert any(next(iter(top)) != max(top, key=top.get) for top in lp.top_logprobs), "all greedy"
    for token, token_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert next(iter(top)) == token and top[token] == pytest.approx(token_lp)
        rest = list(top.values())[1:]
        assert rest == sorted(rest, reverse=True)


def test_chat_logprobs(client: openai.OpenAI, chat):
    r = client.chat.completions.create(
        messages=QUESTION, max_tokens=200, logprobs=True, top_logprobs=2, **GREEDY
    )
    (c,) = r.choices
    assert c.message.content == chat.choices[0].message.content
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    # Like vLLM, the end-of-sequence token that stopped it is counted and has its logprob.
    assert c.finish_reason == "stop"
    assert "".join(t.token for t in content[:-1]) == c.message.content
    assert content[-1].token == "<|im_end|>"
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.top_logprobs[0].token == t.token
        assert t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert bytes(t.bytes) == t.token.encode()


def test_bad_requests(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt=PROMPT, model=SERVED_MODEL_NAME, temperature=-1)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "BadRequestError"
    assert e.value.body["param"] == "temperature"

    # Refused before the stream starts, so the client raises rather than yielding chunks.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            messages=QUESTION, model=SERVED_MODEL_NAME, temperature=-1, stream=True
        )
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"

    # As vLLM: an unknown model is 404 NotFoundError.
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(prompt=PROMPT, model="no-such-model")
    assert e.value.status_code == 404 and e.value.body["type"] == "NotFoundError"
    assert e.value.body["param"] == "model"
    assert "no-such-model" in e.value.message

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt="hello " * 3000, max_tokens=4, **GREEDY)
    assert e.value.status_code == 400
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in e.value.message

    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(prompt=PROMPT, max_tokens=MAX_MODEL_LEN, **GREEDY)
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"

    # The server is still well.
    r = client.completions.create(prompt=PROMPT, max_tokens=4, **GREEDY)
    assert r.choices[0].text and r.usage.completion_tokens == 4


CONCURRENT = 64
SOLO_CHECKED = 4


def test_concurrent_streams(client: openai.OpenAI, async_client: openai.AsyncOpenAI):
    prompts = [f"Here is fact number {i} about the ocean:" for i in range(CONCURRENT)]
    params = dict(max_tokens=16, extra_body={"ignore_eos": True}, **GREEDY)
    # A few of them run alone first: the batched streams must give the same greedy text.
    solo = [client.completions.create(prompt=p, **params).choices[0].text
            for p in prompts[:SOLO_CHECKED]]

    async def one(prompt: str):
        stream = await async_client.completions.create(
            prompt=prompt, stream=True, stream_options={"include_usage": True}, **params
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
            usage = chunk.usage or usage
        return text, finish, usage

    async def all_of_them():
        async with async_client:
            return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(all_of_them())
    assert len(results) == CONCURRENT
    for text, finish, usage in results:
        assert text
        assert finish == "length"
        assert usage is not None and usage.completion_tokens == 16
    assert [t for t, _, _ in results[:SOLO_CHECKED]] == solo
