"""The chat page at `/`, in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by Selenium; `.ci/run` installs them): it names the model, streams
a reply (the chat route's own greedy answer), stops a long one (the server aborts the
request), keeps conversations across a reload, sends the system prompt, and asks for the API
key when the server has one.

Without a browser the tests fail, unless the developer opted out with MINIVLLM_SKIP=browser.
"""

import shutil
import time
import urllib.request

import pytest

from conftest import SERVED_MODEL_NAME as MODEL, serve
from pytest_support import skip_or_fail

def _browser_paths():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return chromium, driver


def _skip_or_fail(why: str):
    skip_or_fail("browser", why)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _skip_or_fail("selenium is not installed")
    chromium, driver = _browser_paths()
    if not chromium or not driver:
        _skip_or_fail("no chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    b = webdriver.Chrome(service=Service(driver), options=options)
    b.set_page_load_timeout(60)
    yield b
    b.quit()


def wait_for(check, timeout=60.0, what="the page"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def by_id(b, id_):
    from selenium.webdriver.common.by import By
    return b.find_element(By.ID, id_)


def messages(b):
    """(role, text) of each message, read at one instant (the page re-renders them)."""
    return [tuple(m) for m in b.execute_script(
        "return [...document.querySelectorAll('#messages .message')]"
        ".map((e) => [e.className.split(' ').pop(), e.innerText.trim()])")]


def set_field(b, id_, value):
    field = by_id(b, id_)
    field.clear()
    field.send_keys(str(value))


def ask(b, text):
    set_field(b, "prompt", text)
    by_id(b, "send").click()


def idle(b):
    return by_id(b, "send").is_displayed()


def fresh_page(b, url):
    b.get(url + "/")
    b.execute_script("localStorage.clear()")
    b.get(url + "/")
    wait_for(lambda: by_id(b, "model").text == MODEL, what="the model's name")


def test_the_page_streams_a_reply_and_keeps_it_across_a_reload(browser, server_url, client):
    b = browser
    fresh_page(b, server_url)
    set_field(b, "temperature", 0)
    set_field(b, "max-tokens", 40)
    ask(b, "What is the capital of France?")
    wait_for(lambda: len(messages(b)) == 2 and idle(b), what="the reply")
    want = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=40,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    ).choices[0].message.content
    (role_q, question), (role_a, answer) = messages(b)
    assert (role_q, question) == ("user", "What is the capital of France?")
    assert role_a == "assistant" and answer == want.strip()

    b.refresh()
    wait_for(lambda: len(messages(b)) == 2, what="the conversation after a reload")
    assert messages(b)[1][1] == want.strip()
    assert "capital of France" in by_id(b, "conversations").text


def test_the_system_prompt_goes_with_the_conversation(browser, server_url, client):
    b = browser
    fresh_page(b, server_url)
    set_field(b, "temperature", 0)
    set_field(b, "max-tokens", 30)
    set_field(b, "system", "You are a pirate.")
    ask(b, "Say hello.")
    wait_for(lambda: len(messages(b)) == 2 and idle(b), what="the reply")
    want = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=30,
        messages=[{"role": "system", "content": "You are a pirate."},
                  {"role": "user", "content": "Say hello."}],
    ).choices[0].message.content
    assert messages(b)[1][1] == want.strip()


def aborted(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:request_success_total") and '"abort"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_stop_ends_a_long_reply_and_the_server_aborts_it(browser, server_url):
    b = browser
    fresh_page(b, server_url)
    # Greedy, this prompt runs to the limit (1,500 tokens): it cannot end before Stop.
    set_field(b, "temperature", 0)
    set_field(b, "max-tokens", 1500)
    before = aborted(server_url)
    ask(b, "Write a very long story about a dragon, in many chapters.")
    # The reply streams in: it grows while it runs.
    first = wait_for(lambda: len(messages(b)) == 2 and len(messages(b)[1][1]) > 20 and messages(b)[1][1],
                     what="streamed text")
    wait_for(lambda: len(messages(b)[1][1]) > len(first), what="more streamed text")
    assert not idle(b), "the reply finished before it could be stopped"
    by_id(b, "stop").click()
    wait_for(lambda: idle(b), what="the stop")
    stopped = messages(b)[1][1]
    time.sleep(0.5)
    assert messages(b)[1][1] == stopped, "text kept coming after Stop"
    wait_for(lambda: aborted(server_url) > before, timeout=10, what="the server to abort it")


@pytest.fixture(scope="module")
def keyed_server(binary: str, model: str):
    server = serve([
        binary, "serve", "--model", model, "--served-model-name", MODEL, "--port", "0",
        "--kv-cache-memory", "64MiB", "--max-model-len", "512", "--api-key", "sesame",
    ])
    yield next(server)
    server.close()


def test_the_page_asks_for_the_api_key(browser, keyed_server):
    b = browser
    b.get(keyed_server + "/")
    b.execute_script("localStorage.clear()")
    b.get(keyed_server + "/")
    wait_for(lambda: by_id(b, "key-panel").is_displayed(), what="the key prompt")
    set_field(b, "api-key", "sesame")
    by_id(b, "save-key").click()
    wait_for(lambda: by_id(b, "model").text == MODEL, what="the model's name with the key")
    set_field(b, "temperature", 0)
    set_field(b, "max-tokens", 10)
    ask(b, "Hi")
    wait_for(lambda: len(messages(b)) == 2 and idle(b), what="the reply")
    assert messages(b)[1][0] == "assistant" and messages(b)[1][1]
