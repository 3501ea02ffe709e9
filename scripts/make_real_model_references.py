#!/usr/bin/env python3
"""Writes reference outputs for two real GGUF models, computed by transformers.

What it makes (small, committed; CI does NOT run this script):
    crates/minivllm/tests/data/real_models/<name>.json         generation/logprob references
    crates/minivllm/tests/data/real_models/<name>.tokens.json  tokenizer corpus check
for
    qwen2.5-coder-0.5b  models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf  (architecture qwen2)
    gemma-3-270m        models/gemma-3-270m.Q4_K_M.gguf                  (architecture gemma3,
                                                                          base model)

Each model is loaded by transformers straight from the GGUF file:
    AutoTokenizer.from_pretrained(models_dir, gguf_file=file)
    AutoModelForCausalLM.from_pretrained(models_dir, gguf_file=file, dtype=torch.float32,
                                         attn_implementation="eager")
transformers de-quantises every tensor to float32 (and, for gemma3, subtracts 1 from every
`*norm.weight`, because llama.cpp's converter stores Gemma's RMSNorm scale as 1 + w while
transformers' Gemma3RMSNorm multiplies by 1 + w itself).  So these references are the
de-quantised weights run in float32, not the original bf16 checkpoints.

<name>.json:
    model, file, file_sha256_16 (first 16 hex digits of the file's SHA-256), architecture,
    transformers_version, torch_version, gguf_version, accelerate_version, date,
    max_new_tokens (24), config (a few fields of the config transformers built),
    prompts: list of
        kind                 short label (english, code, unicode, whitespace, chat, long, ...)
        text                 the prompt text exactly (for "chat", the output of
                             tokenizer.apply_chat_template(..., add_generation_prompt=True,
                             tokenize=False))
        add_special_tokens   what was passed to the tokenizer (Gemma: true, so its BOS is
                             prepended; chat prompt: false, the template already has them)
        prompt_ids           the ids the tokenizer gives for text
        greedy               24 ids from model.generate(max_new_tokens=24, do_sample=False,
                             eos_token_id=None): never stops early
        greedy_text          tokenizer.decode(greedy) (for humans only)
        margins              top-1 minus top-2 raw logit at each of the 24 generate() steps
        min_margin           min(margins)
        first_small_margin_step  first step (0-based) with margin < 0.05, or null
        logprobs             teacher-forced, one forward over prompt_ids + greedy; one entry
                             per generated token k = 0..23, at position
                             p = len(prompt_ids) - 1 + k:
                                 {"pos": p, "id": greedy[k],
                                  "logprob": log_softmax(logits[p])[greedy[k]],
                                  "top5": [[id, logprob], ...] best first}
        forward_argmax_matches_greedy  whether argmax(logits[p]) == greedy[k] for every k
                             (generate() uses the KV cache; the teacher-forced forward does not)
    Floats are rounded to 6 significant digits.

<name>.tokens.json:
    model, file, file_sha256_16, transformers_version, tokenizer_class,
    cases: list of {"text": s, "ids": tokenizer(s, add_special_tokens=False).input_ids}
    over ~40 short strings: code, Unicode (accents, CJK, emoji, ZWJ), whitespace runs,
    tabs, newlines, trailing spaces, digits, contractions.

How to run (needs the models fetched first, from the repository root):
    minivllm download-model qwen2.5-coder-0.5b
    minivllm download-model gemma-3-270m
    /path/to/python scripts/make_real_model_references.py [--models-dir models] [--only NAME]
The python environment needs torch, transformers (GGUF loading), gguf, accelerate (which
transformers requires to load a GGUF) and sentencepiece/tokenizers.  The script uses 2 CPU
threads; loading each GGUF takes 1-2 minutes (transformers parses the GGUF metadata in
pure Python, once for the tokenizer and once for the model), generation a minute or less.
It is re-runnable: it overwrites its outputs, which are deterministic for given versions
(apart from "date").
"""

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/minivllm/tests/data/real_models"
MAX_NEW_TOKENS = 24
SMALL_MARGIN = 0.05
TOP_K = 5

ENGLISH = "The capital of France is"
CODE = "def fibonacci(n):"
UNICODE = "Prix: 1234,56 € — naïve café 日本語"
WHITESPACE = "for i in range(3):\n\tif i  %  2 == 0:\n\t\tprint(i)   \n\n\n    x = 1\t\t# tabs\n"


def long_text(tokenizer, target_tokens=700):
    """~target_tokens tokens of varied, numbered sentences (not trivially periodic)."""
    subjects = ["The old lighthouse keeper", "A young engineer", "The river ferry",
                "Our neighbour's cat", "The city council", "A travelling musician",
                "The night train", "My grandmother"]
    verbs = ["counted", "repaired", "carried", "painted", "sold", "found", "measured",
             "delivered", "wrote about"]
    objects = ["lanterns", "bicycles", "letters", "boxes of apples", "wooden chairs",
               "maps of the coast", "silver coins", "old photographs", "blue bottles",
               "paper kites", "loaves of bread"]
    places = ["in Lisbon", "near the harbour", "behind the station", "at the market",
              "on the hill", "in the library", "by the canal"]
    times = ["on Monday", "before dawn", "last winter", "in 1987", "after the storm",
             "during the festival", "at noon"]
    state = 12345
    sentences = []
    text = ""
    i = 0
    while True:
        # a small LCG so the choices (and the numbers) do not repeat with a short period
        state = (state * 1103515245 + 12345) % (1 << 31)
        r = state >> 8
        n = 3 + (r % 997)
        s = (f"{subjects[r % len(subjects)]} {verbs[(r // 8) % len(verbs)]} {n} "
             f"{objects[(r // 72) % len(objects)]} {places[(r // 792) % len(places)]} "
             f"{times[(r // 5544) % len(times)]}.")
        if i % 5 == 4:
            s += f" That made {n * (i + 2)} in total, or so the ledger (page {i + 17}) says."
        sentences.append(s)
        text = " ".join(sentences)
        i += 1
        if len(tokenizer(text, add_special_tokens=False).input_ids) >= target_tokens:
            return text


def qwen_prompts(tok):
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    return [
        ("english", ENGLISH, True),
        ("code", CODE, True),
        ("unicode", UNICODE, True),
        ("whitespace", WHITESPACE, True),
        ("chat", chat, False),
        ("code_rust", "// Sum the elements of a slice.\nfn sum(xs: &[i64]) -> i64 {\n", True),
    ]


def gemma_prompts(tok):
    return [
        ("english", ENGLISH, True),
        ("code", CODE, True),
        ("unicode", UNICODE, True),
        ("whitespace", WHITESPACE, True),
        ("story", "Once upon a time, in a small village by the sea, there lived", True),
        ("long", long_text(tok), True),
    ]


MODELS = {
    # name: (file, architecture, prompt factory)
    "qwen2.5-coder-0.5b": ("Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "qwen2", qwen_prompts),
    "gemma-3-270m": ("gemma-3-270m.Q4_K_M.gguf", "gemma3", gemma_prompts),
}

TOKEN_CORPUS = [
    # code
    "def foo(x):\n    return x + 1",
    'fn main() { println!("hi"); }',
    "x = [1, 2, 3]",
    "if (a != b && c >= d) {",
    "#include <stdio.h>",
    "SELECT * FROM users WHERE id = 42;",
    '<div class="x">',
    "a->b::c",
    # Unicode
    "café",
    "naïve résumé",
    "Straße",
    "日本語",
    "中文字符测试",
    "한국어",
    "Привет мир",
    "emoji 😀👍🏽",
    "👨‍👩‍👧",
    "€100 — £5 ¥",
    "العربية",
    # whitespace
    "a  b",
    "a   b    c",
    "\tindent",
    "\t\tdouble tab",
    "line1\nline2",
    "\n\n\n",
    "trailing   ",
    "  leading",
    " ",
    "    ",
    "mixed \t \n end",
    "crlf\r\nline",
    # digits
    "1",
    "12",
    "123",
    "1234567",
    "3.14159",
    "2024-12-03",
    "1,000,000",
    # contractions
    "don't",
    "I'LL",
    "we've they're",
    "It's can't WON'T",
    # plain
    "Hello, world!",
]


def to_json(obj, indent=0):
    """Pretty JSON, but lists without dicts inside stay on one line (keeps diffs readable)."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {to_json(v, indent + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, dict) for v in obj):
        items = [inner + to_json(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return json.dumps(obj, ensure_ascii=False)


def r6(x):
    return float(f"{float(x):.6g}")


def sha256_16(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def version(pkg):
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


def config_summary(config):
    keys = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "rope_parameters", "sliding_window", "layer_types", "query_pre_attn_scalar",
            "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
            "final_logit_softcapping", "attn_logit_softcapping", "max_position_embeddings"]
    d = config.to_dict()
    return {k: d[k] for k in keys if k in d}


@torch.no_grad()
def reference_case(model, tok, kind, text, add_special, pad_id):
    prompt_ids = tok(text, add_special_tokens=add_special).input_ids
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=MAX_NEW_TOKENS,
        min_new_tokens=MAX_NEW_TOKENS,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=pad_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    greedy = out.sequences[0, len(prompt_ids):].tolist()
    assert len(greedy) == MAX_NEW_TOKENS, (kind, len(greedy))
    margins = []
    for step, logits in enumerate(out.logits):
        top2 = torch.topk(logits[0].float(), 2)
        assert top2.indices[0].item() == greedy[step] or top2.values[0] == top2.values[1]
        margins.append((top2.values[0] - top2.values[1]).item())

    full = torch.tensor([prompt_ids + greedy], dtype=torch.long)
    logits = model(full, attention_mask=torch.ones_like(full)).logits[0].float()
    logprobs = []
    matches = True
    for k in range(MAX_NEW_TOKENS):
        p = len(prompt_ids) - 1 + k
        lsm = torch.log_softmax(logits[p], dim=-1)
        top = torch.topk(lsm, TOP_K)
        if top.indices[0].item() != greedy[k]:
            matches = False
        logprobs.append({
            "pos": p,
            "id": greedy[k],
            "logprob": r6(lsm[greedy[k]]),
            "top5": [[i, r6(v)] for i, v in zip(top.indices.tolist(), top.values.tolist())],
        })
    small = [i for i, m in enumerate(margins) if m < SMALL_MARGIN]
    return {
        "kind": kind,
        "text": text,
        "add_special_tokens": add_special,
        "prompt_ids": prompt_ids,
        "greedy": greedy,
        "greedy_text": tok.decode(greedy),
        "margins": [r6(m) for m in margins],
        "min_margin": r6(min(margins)),
        "first_small_margin_step": small[0] if small else None,
        "logprobs": logprobs,
        "forward_argmax_matches_greedy": matches,
    }


def run_model(name, models_dir):
    file, arch, make_prompts = MODELS[name]
    path = models_dir / file
    if not path.exists():
        raise SystemExit(f"{path} not found: run `minivllm download-model {name}` first")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(models_dir, gguf_file=file)
    t1 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=file, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    t2 = time.time()
    print(f"[{name}] tokenizer {t1 - t0:.1f}s, model {t2 - t1:.1f}s "
          f"({type(tok).__name__}, {type(model).__name__})", flush=True)
    model.generation_config.eos_token_id = None
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    model.generation_config.pad_token_id = pad_id

    common = {
        "model": name,
        "file": file,
        "file_sha256_16": sha256_16(path),
        "transformers_version": transformers.__version__,
    }
    cases = []
    for kind, text, add_special in make_prompts(tok):
        ts = time.time()
        case = reference_case(model, tok, kind, text, add_special, pad_id)
        cases.append(case)
        print(f"[{name}] {kind}: {len(case['prompt_ids'])} prompt tokens, "
              f"min margin {case['min_margin']}, first <{SMALL_MARGIN} at "
              f"{case['first_small_margin_step']}, forward argmax matches: "
              f"{case['forward_argmax_matches_greedy']}, {time.time() - ts:.1f}s\n"
              f"    -> {case['greedy_text']!r}", flush=True)

    ref = {
        **common,
        "architecture": arch,
        "torch_version": torch.__version__,
        "gguf_version": version("gguf"),
        "accelerate_version": version("accelerate"),
        "date": datetime.date.today().isoformat(),
        "attn_implementation": "eager",
        "dtype": "float32",
        "max_new_tokens": MAX_NEW_TOKENS,
        "config": config_summary(model.config),
        "prompts": cases,
    }
    tokens = {
        **common,
        "tokenizer_class": type(tok).__name__,
        "add_special_tokens": False,
        "cases": [{"text": s, "ids": tok(s, add_special_tokens=False).input_ids}
                  for s in TOKEN_CORPUS],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    for suffix, obj in ((".json", ref), (".tokens.json", tokens)):
        p = OUT / f"{name}{suffix}"
        p.write_text(to_json(obj) + "\n", encoding="utf-8")
        assert json.loads(p.read_text(encoding="utf-8")) == obj
        print(f"[{name}] wrote {p.relative_to(ROOT)} ({p.stat().st_size} bytes)", flush=True)
    print(f"[{name}] total {time.time() - t0:.1f}s", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", type=Path, default=ROOT / "models")
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    for name in args.only or list(MODELS):
        run_model(name, args.models_dir.resolve())


if __name__ == "__main__":
    main()
