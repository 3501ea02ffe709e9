"""vLLM-style scripts against the `minivllm` package: only the import line differs from
vLLM's. Each result is held to the command line's, to one-at-a-time runs, or to itself."""

import json
import logging
import math
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from minivllm import LLM, CompletionOutput, Logprob, RequestOutput, SamplingParams

from conftest import ENGINE
from pytest_support import ROOT

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "The three primary colours are",
]


def cli_generate(binary, model, prompts, *flags):
    """What `minivllm generate --json` prints for these prompts, one dict per prompt."""
    with_prompts = [a for p in prompts for a in ("--prompt", p)]
    cmd = [
        binary, "generate", "--model", model, "--json",
        "--max-model-len", str(ENGINE["max_model_len"]),
        "--kv-cache-memory", ENGINE["kv_cache_memory"],
        *with_prompts, *flags,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def greedy(max_tokens=24, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_greedy_generation_matches_the_cli_token_for_token(llm, binary, model):
    outputs = llm.generate(PROMPTS, greedy(logprobs=2), use_tqdm=False)
    expected = cli_generate(
        binary, model, PROMPTS, "--temperature", "0", "--max-tokens", "24", "--logprobs", "2"
    )
    assert len(outputs) == len(expected) == len(PROMPTS)
    for out, want, prompt in zip(outputs, expected, PROMPTS):
        assert isinstance(out, RequestOutput) and out.finished
        assert out.prompt == prompt
        assert out.prompt_token_ids == want["prompt_token_ids"]
        got = out.outputs[0]
        assert isinstance(got, CompletionOutput)
        assert got.token_ids == want["outputs"][0]["token_ids"]
        assert got.text == want["outputs"][0]["text"]
        assert got.finish_reason == want["outputs"][0]["finish_reason"]
        assert got.cumulative_logprob == pytest.approx(want["outputs"][0]["cumulative_logprob"])
        for position, want_lp in zip(got.logprobs, want["outputs"][0]["logprobs"]):
            assert {t: lp.logprob for t, lp in position.items()} == pytest.approx(
                {int(t): lp for t, lp in want_lp.items()}
            )


def test_mixed_prompt_forms_in_one_batch_equal_one_at_a_time(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("The three primary colours are")
    prompts = [
        "The capital of France is",
        {"prompt": "Once upon a time, in a land far away,"},
        {"prompt_token_ids": ids},
        ids,
    ]
    params = [greedy(8), greedy(12), greedy(5, stop=["."]), greedy(3)]
    batched = llm.generate(prompts, params, use_tqdm=False)
    assert [o.request_id for o in batched] == sorted({o.request_id for o in batched}, key=int)
    assert batched[0].prompt == prompts[0] and batched[1].prompt == prompts[1]["prompt"]
    assert batched[2].prompt is None and batched[2].prompt_token_ids == ids
    for prompt, p, out in zip(prompts, params, batched):
        alone = llm.generate(prompt, p, use_tqdm=False)
        assert len(alone) == 1
        assert alone[0].outputs[0].token_ids == out.outputs[0].token_ids
        assert alone[0].outputs[0].text == out.outputs[0].text
    assert len(batched[3].outputs[0].token_ids) == 3


def test_n_completions_with_a_seed_reproduce(llm):
    params = SamplingParams(n=3, temperature=0.9, top_p=0.95, seed=7, max_tokens=16)
    first = llm.generate("Write a short poem about the sea.", params, use_tqdm=False)[0]
    again = llm.generate("Write a short poem about the sea.", params, use_tqdm=False)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1, "three samples, one text"
    other = llm.generate(
        "Write a short poem about the sea.", params.clone()._with_seed(8), use_tqdm=False
    )[0]
    assert [c.token_ids for c in other.outputs] != [c.token_ids for c in first.outputs]


def test_llm_seed_makes_unseeded_sampling_reproducible(model):
    params = SamplingParams(temperature=1.0, max_tokens=12)
    runs = []
    for _ in range(2):
        llm = LLM(model=model, seed=1234, **ENGINE)
        runs.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)])
        del llm
    assert runs[0] == runs[1]


def test_stop_strings_end_completions(llm):
    prompt = "List three fruits: apple, banana,"
    free = llm.generate(prompt, greedy(32), use_tqdm=False)[0].outputs[0]
    assert "," in free.text, free.text
    out = llm.generate(prompt, greedy(32, stop=[","]), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == ","
    assert "," not in out.text and free.text.startswith(out.text)
    kept = llm.generate(prompt, greedy(32, stop=",", include_stop_str_in_output=True), use_tqdm=False)
    assert kept[0].outputs[0].text == out.text + ","


def test_stop_token_ids_and_length_finish_reasons(llm):
    free = llm.generate("The capital of France is", greedy(8), use_tqdm=False)[0].outputs[0]
    assert free.finish_reason == "length" and free.stop_reason is None
    assert free.cumulative_logprob is None, "only tracked with logprobs, as vLLM"
    stop_at = free.token_ids[2]
    out = llm.generate(
        "The capital of France is", greedy(8, stop_token_ids=[stop_at]), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at
    assert out.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]


def test_logprobs_and_prompt_logprobs(llm):
    params = greedy(6, logprobs=3, prompt_logprobs=2)
    out = llm.generate("The capital of France is", params, use_tqdm=False)[0]
    completion = out.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids)
    total = 0.0
    for token, position in zip(completion.token_ids, completion.logprobs):
        assert token in position and 3 <= len(position) <= 4
        chosen = position[token]
        assert isinstance(chosen, Logprob)
        # Greedy picks the most likely token: rank 1, and no logprob above it.
        assert chosen.rank == 1
        assert chosen.logprob == max(lp.logprob for lp in position.values())
        assert sorted(lp.rank for lp in position.values()) == list(range(1, len(position) + 1))
        assert chosen.decoded_token == llm.get_tokenizer().decode([token])
        total += chosen.logprob
    assert completion.cumulative_logprob == pytest.approx(total, abs=1e-4)

    prompt_lps = out.prompt_logprobs
    assert len(prompt_lps) == len(out.prompt_token_ids) and prompt_lps[0] is None
    for token, position in zip(out.prompt_token_ids[1:], prompt_lps[1:]):
        assert token in position and 2 <= len(position) <= 3
        assert all(lp.logprob <= 0.0 and math.isfinite(lp.logprob) for lp in position.values())
        others = sorted(lp.rank for t, lp in position.items() if t != token)
        if len(position) == 3:  # the prompt token is outside the top 2
            assert position[token].rank >= 3 and others == [1, 2]
        else:
            assert sorted([position[token].rank, *others]) == [1, 2]


def test_all_logprobs_where_the_llm_allows_them(model):
    llm = LLM(model=model, max_logprobs=-1, **ENGINE)
    try:
        top = llm.generate("The capital of France is", greedy(2, logprobs=3, prompt_logprobs=3),
                           use_tqdm=False)[0]
        out = llm.generate("The capital of France is", greedy(2, logprobs=-1, prompt_logprobs=-1),
                           use_tqdm=False)[0]
    finally:
        del llm
    vocab = 49152
    completion = out.outputs[0]
    assert completion.token_ids == top.outputs[0].token_ids
    positions = [*out.prompt_logprobs[1:], *completion.logprobs]
    top_positions = [*top.prompt_logprobs[1:], *top.outputs[0].logprobs]
    assert len(positions) == len(out.prompt_token_ids) - 1 + 2
    for position, three in zip(positions, top_positions):
        assert len(position) == vocab
        assert sorted(lp.rank for lp in position.values()) == list(range(1, vocab + 1))
        assert math.fsum(math.exp(lp.logprob) for lp in position.values()) == pytest.approx(1, abs=1e-3)
        # The top 3 (and the actual token) as a top-3 request reports them.
        for token, lp in three.items():
            assert position[token] == lp


def test_chat_uses_the_models_template_or_one_given(llm, binary, model):
    messages = [{"role": "user", "content": "What is the capital of Germany?"}]
    out = llm.chat(messages, greedy(16), use_tqdm=False)[0]
    tok = llm.get_tokenizer()
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert out.prompt_token_ids == ids
    assert out.prompt == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in out.prompt
    cli = cli_generate(binary, model, [messages[0]["content"]], "--chat", "--temperature", "0",
                       "--max-tokens", "16")
    assert out.outputs[0].token_ids == cli[0]["outputs"][0]["token_ids"]
    # Several conversations in one call, OpenAI's content parts included.
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital of Germany?"}]}]
    both = llm.chat([messages, parts], greedy(16), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in both] == [out.outputs[0].token_ids] * 2
    # Another template and its variables (Gemma 4's, thinking off unless asked for), from
    # the chat call and from the tokenizer.
    gemma4 = str(ROOT / "tests" / "data" / "templates" / "google-gemma-4-31B-it.jinja")
    off = llm.chat(messages, greedy(1), use_tqdm=False, chat_template=gemma4)[0].prompt
    on = llm.chat(messages, greedy(1), use_tqdm=False, chat_template=gemma4,
                  chat_template_kwargs={"enable_thinking": True})[0].prompt
    assert off.endswith("<|turn>model\n<|channel>thought\n<channel|>"), off
    assert "<|think|>" in on and on.endswith("<|turn>model\n"), on
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        llm.chat(messages, chat_template_kwargs=["enable_thinking"])
    with pytest.raises(ValueError, match="does not compile"):
        llm.chat(messages, chat_template="{% if %}")
    with pytest.raises(ValueError, match="looks like a file path"):
        llm.chat(messages, chat_template="templates/no-such.jinja")
    # What would change the prompt is refused, never dropped.
    with pytest.raises(ValueError, match="continue_final_message"):
        llm.chat(messages, continue_final_message=True)
    with pytest.raises(TypeError):
        llm.chat(messages, no_such_option=1)
    with pytest.raises(ValueError, match="chat_template"):
        tok.apply_chat_template(messages, chat_template="{{ 1 }}")
    # Other keywords are template variables, as in transformers (SmolLM2's reads none).
    assert tok.apply_chat_template(messages, enable_thinking=False) == tok.apply_chat_template(messages)
    assert tok.convert_tokens_to_ids(tok.eos_token) == tok.eos_token_id
    assert tok.apply_chat_template(messages, return_dict=True) == {"input_ids": tok.apply_chat_template(messages)}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be at least 1, got 0."),
        ({"temperature": -1.0}, "temperature must be non-negative, got -1.0."),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"top_k": -5}, "top_k must be 0 (disable), or at least 1, got -5."),
        ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
        ({"presence_penalty": 3.0}, "presence_penalty must be in [-2, 2], got 3.0."),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be greater than zero, got 0.0."),
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0."),
        ({"min_tokens": -1}, "min_tokens must be greater than or equal to 0, got -1."),
        ({"logprobs": -2}, "logprobs must be non-negative or -1, got -2."),
        ({"n": 2, "best_of": 1}, "best_of must be greater than or equal to n"),
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"top_p": float("nan")}, "top_p must be in (0, 1], got nan."),
        ({"logits_processors": [print]}, "logits_processors is not supported"),
    ],
)
def test_invalid_sampling_parameters_raise_value_error(kwargs, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**kwargs)
    assert message in str(e.value)


def test_generation_config_gives_the_default_sampling_params(tmp_path):
    from minivllm.llm import _generation_defaults

    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 64, "do_sample": True})
    )
    defaults = _generation_defaults(str(tmp_path))
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 64}
    assert SamplingParams(**defaults).max_tokens == 64
    assert _generation_defaults(str(tmp_path / "model.gguf")) == {}
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json"):
        _generation_defaults(str(tmp_path))


def test_sampling_params_normalise_as_vllm():
    p = SamplingParams(seed=-1, logprobs=True)
    assert p.stop == [] and p.stop_token_ids == [] and p.seed is None and p.logprobs == 1
    assert SamplingParams(stop="x").stop == ["x"]
    assert p.clone() == p and p.clone() is not p


def test_invalid_requests_raise_value_error_and_run_nothing(llm):
    with pytest.raises(ValueError, match="longer than the maximum model length"):
        llm.generate("word " * 2000, greedy(4), use_tqdm=False)
    with pytest.raises(ValueError, match="must be the same"):
        llm.generate(["a", "b"], [greedy(4)], use_tqdm=False)
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate({"prompt_token_ids": [1, 10**7]}, greedy(4), use_tqdm=False)
    with pytest.raises(ValueError, match="greater than max allowed"):
        llm.generate("Hi", greedy(4, logprobs=10**6), use_tqdm=False)
    # -1, the whole vocabulary, only where the LLM allows it (max_logprobs=-1).
    with pytest.raises(ValueError, match="prompt logprobs of 49152, which is greater than max allowed: 20"):
        llm.generate("Hi", greedy(4, prompt_logprobs=-1), use_tqdm=False)
    params = greedy(4)
    params.top_p = 2.0  # changed after it was made: checked again at submission
    with pytest.raises(ValueError, match="top_p must be in"):
        llm.generate("Hi", params, use_tqdm=False)
    # A batch with one bad request runs none of them, and the engine serves the next call.
    with pytest.raises(ValueError):
        llm.generate(["Hi", "word " * 2000], greedy(64, ignore_eos=True), use_tqdm=False)
    assert llm.generate("Hi", greedy(2), use_tqdm=False)[0].finished
    # Every request's parameters are checked before any of the batch is queued: no step runs.
    bad = greedy(4)
    bad.top_p = 2.0
    steps = llm._engine.num_steps
    with pytest.raises(ValueError, match="top_p must be in"):
        llm.generate(["Hi", "Hello"], [greedy(64, ignore_eos=True), bad], use_tqdm=False)
    assert llm._engine.num_steps == steps


@pytest.mark.parametrize("fields, message", [
    ({"seed": "x"}, "seed must be an int, got str ('x')"),
    ({"temperature": "hot"}, "temperature must be a number, got str"),
    ({"n": 2.5}, "n must be an int, got float"),
    ({"stop": 5}, "stop must be a string or a list of strings, got int"),
    ({"max_tokens": "10"}, "max_tokens must be an int, got str"),
    ({"ignore_eos": 1}, "ignore_eos must be a bool, got int"),
    ({"stop_token_ids": ["2"]}, "stop_token_ids must be a list of ints"),
])
def test_wrong_types_are_named(fields, message):
    with pytest.raises(TypeError) as e:
        SamplingParams(**fields)
    assert message in str(e.value)


def test_a_dict_for_sampling_params_is_named(llm):
    with pytest.raises(TypeError, match=r"SamplingParams\(\*\*params\)"):
        llm.generate("Hi", {"temperature": 0}, use_tqdm=False)


def test_vllm_prompt_types_and_tokenize(llm):
    from minivllm.inputs import TextPrompt, TokensPrompt

    tok = llm.get_tokenizer()
    ids = tok.encode("The capital of France is", add_special_tokens=False)
    assert tok.tokenize("The capital of France is") == tok.convert_ids_to_tokens(ids)
    assert tok.tokenize(" Paris")[0].endswith("Paris")
    by_text = llm.generate(TextPrompt(prompt="The capital of France is"), greedy(4), use_tqdm=False)
    by_ids = llm.generate(TokensPrompt(prompt_token_ids=by_text[0].prompt_token_ids), greedy(4),
                          use_tqdm=False)
    assert by_ids[0].outputs[0].token_ids == by_text[0].outputs[0].token_ids


def test_bad_engine_arguments(model, tmp_path):
    with pytest.raises(RuntimeError):
        LLM(model=str(tmp_path / "missing.gguf"))
    with pytest.raises(ValueError, match="dtype"):
        LLM(model=model, dtype="float8", **ENGINE)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_sequences'"):
        LLM(model=model, max_num_sequences=4)
    # vLLM's GGUF recipe names the base model's tokenizer: the file's own is used.
    other = LLM(model=model, tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct", **ENGINE)
    assert other.get_tokenizer().encode("Hi") == LLM(model=model, **ENGINE).get_tokenizer().encode("Hi")


def test_two_threads_generate_at_once_and_share_steps(llm):
    prompts = {"a": PROMPTS[:2], "b": PROMPTS[2:]}
    params = greedy(32, ignore_eos=True)
    alone = {k: llm.generate(p, params, use_tqdm=False) for k, p in prompts.items()}
    results, errors = {}, []
    start = threading.Barrier(2)

    def run(key):
        try:
            start.wait()
            results[key] = llm.generate(prompts[key], params, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    steps_before = llm._engine.num_steps
    threads = [threading.Thread(target=run, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for key in prompts:
        assert [o.outputs[0].token_ids for o in results[key]] == [
            o.outputs[0].token_ids for o in alone[key]
        ]
    # Together, the two calls' requests were batched: fewer steps than one after the other.
    assert llm._engine.num_steps - steps_before < 2 * 32


# Both tests give Ctrl-C the handler a terminal's Python has: a test run started in the
# background by a non-interactive shell inherits SIGINT ignored, and Python then installs no
# KeyboardInterrupt handler (and `interrupt_main` raises nothing).


def test_ctrl_c_aborts_the_call_and_the_engine_serves_on(llm):
    import _thread

    params = greedy(1000, ignore_eos=True)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(["Tell me a long story."] * 4, params, use_tqdm=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 10
    out = llm.generate("The capital of France is", greedy(8), use_tqdm=False)
    assert out[0].outputs[0].text.startswith(" Paris")


def test_ctrl_c_in_a_script_ends_it(model):
    script = (
        "import sys\n"
        "from minivllm import LLM, SamplingParams\n"
        f"llm = LLM(model={model!r}, max_model_len=1024, kv_cache_memory='256MiB')\n"
        "print('ready', flush=True)\n"
        "llm.generate(['Tell me a long story.'] * 4, "
        "SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True), use_tqdm=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(2)  # SIGINT, as Ctrl-C sends
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("Ctrl-C did not stop generate within 10 s")
    assert "KeyboardInterrupt" in err
    # Ended by the signal (as Python ends on an unhandled Ctrl-C), not by a crash at exit.
    assert proc.returncode in (-2, 130, 1), (proc.returncode, err)


def test_progress_bar_and_logging(llm, model, capsys, caplog):
    pytest.importorskip("tqdm")
    llm.generate(PROMPTS[:2], greedy(2), use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err
    with caplog.at_level(logging.INFO, logger="minivllm"):
        LLM(model=model, **ENGINE)
    assert any(
        r.name.startswith("minivllm.") and "model loaded" in r.getMessage() for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_python_dash_m_runs_the_command_line(model):
    out = subprocess.run(
        [sys.executable, "-m", "minivllm", "generate", "--model", model, "--prompt",
         "The capital of France is", "--temperature", "0", "--max-tokens", "4", "--json",
         "--max-model-len", "1024", "--kv-cache-memory", "256MiB"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outputs"][0]["text"].startswith(" Paris")
    bad = subprocess.run([sys.executable, "-m", "minivllm", "generate", "--no-such-flag"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr


def test_tensor_parallel_script_under_mpirun_matches_one_process(model, tmp_path):
    """A vLLM-style script with tensor_parallel_size=3 under mpirun (SmolLM2: 9 heads, 3 KV
    heads): rank 0 prints the same greedy tokens as one process; the workers end cleanly."""
    from pytest_support import skip_or_fail

    if shutil.which("mpirun") is None:
        skip_or_fail("mpi", "Open MPI is not installed (apt-get install openmpi-bin libopenmpi-dev)")
    script = tmp_path / "tp.py"
    script.write_text(
        "import json, sys\n"
        "from minivllm import LLM, SamplingParams\n"
        "tp = int(sys.argv[1])\n"
        f"llm = LLM(model={model!r}, dtype='float32', tensor_parallel_size=tp, threads=1, "
        "max_model_len=1024, kv_cache_memory='64MiB')\n"
        "outs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=12), "
        "use_tqdm=False)\n"
        "print(json.dumps([o.outputs[0].token_ids for o in outs]))\n"
    )
    prompts = json.dumps(PROMPTS)
    alone = subprocess.run([sys.executable, str(script), "1", prompts],
                           capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    tp = subprocess.run(
        ["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "3",
         sys.executable, str(script), "3", prompts],
        capture_output=True, text=True, timeout=300,
    )
    assert tp.returncode == 0, tp.stderr
    # Only rank 0 gets past LLM(): one line of output.
    assert tp.stdout.strip().splitlines() == alone.stdout.strip().splitlines()


def test_python_dash_m_serves_until_ctrl_c(model):
    import re
    import signal
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "minivllm", "serve", "--model", model, "--port", "0",
         "--max-model-len", "1024", "--kv-cache-memory", "64MiB"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = None
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            m = re.search(r" on (http://[0-9.]+:[0-9]+)", line)
            url = m.group(1) if m else None
        assert url, f"no 'serving ... on' line; exit status {proc.poll()}"
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the server drains and exits 0
        proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_structured_outputs_as_in_vllm(llm):
    """vLLM's `StructuredOutputsParams` (with a pydantic model's schema, a regex, a
    choice), each output checked independently; a constraint that does not compile is a
    ValueError naming it."""
    import re

    import pydantic
    from minivllm import SamplingParams
    from minivllm.sampling_params import GuidedDecodingParams, StructuredOutputsParams

    class Car(pydantic.BaseModel):
        # No keys beyond these (as OpenAI's strict schemas): sampled at temperature 0.8, a
        # 135M model left free to add keys may still be naming one at max_tokens.
        model_config = pydantic.ConfigDict(extra="forbid")
        brand: str = pydantic.Field(max_length=12)
        doors: int = pydantic.Field(ge=2, le=5)

    car = SamplingParams(temperature=0.8, seed=5, n=3, max_tokens=120,
                         structured_outputs=StructuredOutputsParams(json=Car))
    rx = SamplingParams(temperature=0.8, seed=5, n=3, max_tokens=40,
                        structured_outputs=StructuredOutputsParams(regex=r"[a-z]{1,8}@[a-z]{1,8}\.com"))
    pick = SamplingParams(temperature=0.8, seed=5, n=3,
                          guided_decoding=GuidedDecodingParams(choice=["Positive", "Negative"]))
    cars, mails, picks = (llm.generate(["Describe a car as JSON:"], p)[0] for p in (car, rx, pick))
    for c in cars.outputs:
        Car.model_validate(json.loads(c.text))
    assert all(re.fullmatch(r"[a-z]{1,8}@[a-z]{1,8}\.com", c.text) for c in mails.outputs)
    assert all(c.text in ("Positive", "Negative") for c in picks.outputs)
    bad = SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed"))
    with pytest.raises(ValueError, match="invalid regex"):
        llm.generate(["x"], bad)
    with pytest.raises(ValueError, match="multiple are specified"):
        SamplingParams(structured_outputs=StructuredOutputsParams(regex="a", choice=["b"]))
    # vLLM's structural tag reaches the engine (checked there: this one's trigger opens nothing).
    tag = {"type": "structural_tag", "triggers": ["<a", "<b"],
           "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}]}
    with pytest.raises(ValueError, match="begins no structure"):
        llm.generate(["x"], SamplingParams(
            structured_outputs=StructuredOutputsParams(structural_tag=json.dumps(tag))))


def test_chat_with_tools_renders_them_through_the_template():
    """vLLM's `LLM.chat(..., tools=...)` and the tokenizer's `apply_chat_template(tools=)`:
    Qwen2.5's template describes the tools, writes an earlier call and its result as the
    model was trained on them. Needs the Qwen2.5 file (./scripts/test.sh fetches it)."""
    from minivllm import LLM, SamplingParams
    from pytest_support import qwen_model

    qwen = qwen_model()
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C, sunny"},
    ]
    llm = LLM(model=qwen, max_model_len=1024, kv_cache_memory="64MiB")
    tok = llm.get_tokenizer()
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n21 C, sunny\n</tool_response>" in text
    out = llm.chat(messages, SamplingParams(max_tokens=8, temperature=0), tools=tools, use_tqdm=False)[0]
    assert out.prompt == text
    assert out.prompt_token_ids == tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    with pytest.raises(ValueError, match="arguments is not JSON"):
        bad = [dict(messages[1], tool_calls=[{"id": "c", "function": {"name": "f", "arguments": "{x"}}])]
        tok.apply_chat_template(bad, tools=tools, tokenize=False)


def test_reasoning_parser_lets_the_model_think_before_a_constrained_answer(model):
    """`LLM(reasoning_parser=...)`, as vLLM's engine argument: structured output starts after
    `</think>`; a prompt that closed the thinking (thinking off) is constrained at once."""
    import re

    from minivllm import LLM, SamplingParams
    from minivllm.sampling_params import StructuredOutputsParams

    llm = LLM(model=model, max_model_len=512, kv_cache_memory="32MiB", reasoning_parser="deepseek_r1")
    p = SamplingParams(max_tokens=10, temperature=0,
                       structured_outputs=StructuredOutputsParams(regex="[0-9]{3}"))
    thinking, off = llm.generate(["Cats are<think>\n", "Cats are<think>\n\n</think>\n\n"], p,
                                 use_tqdm=False)
    # Free while thinking: not what the constraint would allow.
    assert re.search("[^0-9]", thinking.outputs[0].text), thinking.outputs[0].text
    assert re.fullmatch("[0-9]{3}", off.outputs[0].text), off.outputs[0].text
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        LLM(model=model, max_model_len=512, kv_cache_memory="32MiB", reasoning_parser="o1")


def assert_same_tokens(spec, plain, prompts):
    """`spec` gives `plain`'s tokens, greedy and seeded with two completions a prompt."""
    from minivllm import SamplingParams

    for p in (SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=3, n=2, max_tokens=24)):
        want = [[c.token_ids for c in o.outputs] for o in plain.generate(prompts, p, use_tqdm=False)]
        got = [[c.token_ids for c in o.outputs] for o in spec.generate(prompts, p, use_tqdm=False)]
        assert got == want, p


def test_ngram_speculation_gives_the_same_outputs(llm, model):
    """vLLM's `speculative_config` (n-gram prompt lookup): the same tokens as plain
    decoding, greedy and seeded; a config vLLM would refuse is a ValueError."""
    from minivllm import LLM

    spec = LLM(model=model, max_model_len=1024, kv_cache_memory="64MiB", speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    prompts = ["a b c d a b c d a b c", "def f(x):\n    return x\n\ndef g(x):\n    return"]
    assert_same_tokens(spec, llm, prompts)
    with pytest.raises(ValueError, match="prompt_lookup_min=4 must be <= prompt_lookup_max=2"):
        LLM(model=model, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                             "prompt_lookup_min": 4, "prompt_lookup_max": 2})


def test_draft_model_speculation_gives_the_same_outputs(llm, model):
    """`speculative_config` with a draft model (the test model drafting for itself, with a
    fixed draft length so guesses are made whatever they cost): the same tokens as plain
    decoding, greedy and seeded; a draft that is not there is an error naming it (as a
    missing model is)."""
    from minivllm import LLM

    spec = LLM(model=model, max_model_len=1024, kv_cache_memory="64MiB", speculative_config={
        "method": "draft_model", "model": model, "num_speculative_tokens": 3,
        "adaptive_draft_length": False})
    prompts = ["The capital of France is", "def f(x):\n    return"]
    assert_same_tokens(spec, llm, prompts)
    with pytest.raises(RuntimeError, match="missing-draft.gguf"):
        LLM(model=model, speculative_config={"method": "draft_model", "num_speculative_tokens": 2,
                                             "model": "missing-draft.gguf"})


def test_kv_events_config_publishes_vllms_events(model):
    """LLM(kv_events_config=...) publishes the prefix cache's blocks as the server does
    (the wire is checked in full by tests/python/test_kv_events.py)."""
    import socket

    import msgspec
    import zmq

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = LLM(model=model, kv_events_config={"enable_kv_cache_events": True,
                                             "endpoint": f"tcp://127.0.0.1:{port}"}, **ENGINE)
    ctx = zmq.Context()
    try:
        sub = ctx.socket(zmq.SUB)
        sub.connect(f"tcp://127.0.0.1:{port}")
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.5)
        prompt = list(range(500, 540))
        llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=1), use_tqdm=False)
        assert sub.poll(5000), "no KV cache events"
        _, seq, payload = sub.recv_multipart()
        ts, events, rank = msgspec.msgpack.decode(payload)
        assert (int.from_bytes(seq, "big"), rank) == (0, 0)
        assert events[0]["type"] == "BlockStored" and events[0]["token_ids"] == prompt[:32]
    finally:
        ctx.destroy(linger=0)
        del llm
    with pytest.raises(ValueError, match="kv-events-config"):
        LLM(model=model, kv_events_config={"endpoint": "ipc:///tmp/kv"}, **ENGINE)


def test_kv_transfer_config_hands_a_prefill_to_another_llm(model):
    """vLLM's offline disaggregation: one LLM prefills with ``do_remote_decode`` and returns
    ``kv_transfer_params``; another, given them in ``extra_args``, pulls the KV and decodes
    the tokens a plain LLM gives (docs/distributed.md)."""
    prompt = "The history of the city begins with a small settlement on the river bank"
    config = {"kv_connector": "TcpConnector", "kv_port": 0}
    prefill = LLM(model=model, kv_transfer_config={**config, "kv_role": "kv_producer"}, **ENGINE)
    decode = LLM(model=model, kv_transfer_config={**config, "kv_role": "kv_consumer"}, **ENGINE)
    # On the prefill LLM: run on the decode one, it would leave the prompt in its prefix
    # cache, and the pull would have nothing left to bring.
    want = prefill.generate(prompt, SamplingParams(temperature=0, max_tokens=12),
                            use_tqdm=False)[0].outputs[0].token_ids
    keep = SamplingParams(temperature=0, max_tokens=1,
                          extra_args={"kv_transfer_params": {"do_remote_decode": True}})

    def pull(kv):
        return SamplingParams(temperature=0, max_tokens=12, extra_args={"kv_transfer_params": kv})

    kv = prefill.generate(prompt, keep, use_tqdm=False)[0].kv_transfer_params
    assert kv["do_remote_prefill"] and kv["remote_port"] > 0, kv
    # KV of another prompt than the request's is refused (vLLM's default policy, "fail").
    with pytest.raises(RuntimeError, match="prompt tokens differ"):
        decode.generate("Snow covers the pine forest under a pale moon", pull(kv),
                        use_tqdm=False)
    kv = prefill.generate(prompt, keep, use_tqdm=False)[0].kv_transfer_params
    out = decode.generate(prompt, pull(kv), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == want
    assert out.num_cached_tokens == len(out.prompt_token_ids) - 1
    with pytest.raises(ValueError, match="extra_args"):
        decode.generate(prompt, SamplingParams(extra_args={"other": 1}), use_tqdm=False)
    with pytest.raises(ValueError, match="kv-transfer-config"):
        LLM(model=model, kv_transfer_config={"kv_connector": "NixlConnector"}, **ENGINE)
