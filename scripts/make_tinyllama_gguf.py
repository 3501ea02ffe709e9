#!/usr/bin/env python3
"""Writes a random-weight LLaMA GGUF with TinyLlama-1.1B's shape, for benchmarks.

SmolLM2-135M's 92 MiB of weights may sit in a large L3 cache; a 1.1B model's cannot, so its
decode speed measures what the machine's memory bandwidth allows. The weights are random
(normal, std 0.02; norms 1), so the text is nonsense, but every kernel sees the shapes and
byte counts of the real model: 22 layers, hidden 2048, 32 heads, 4 KV heads, intermediate
5632, vocabulary 32000 (a synthetic SentencePiece-style one), context 2048. llama.cpp reads the
same file, so both engines can be run on it side by side.

    python3 -m venv /tmp/gguf-env && /tmp/gguf-env/bin/pip install gguf numpy
    /tmp/gguf-env/bin/python scripts/make_tinyllama_gguf.py --type Q4_1 models/tinyllama-shape.Q4_1.gguf

`--type` is Q4_1, Q4_0, Q8_0 or F16 (token embeddings and output use the same type; norms
stay F32). Takes a minute or two and ~4.5 GB of memory at its peak.
"""

import argparse

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

HIDDEN, LAYERS, HEADS, KV_HEADS, INTER, VOCAB, CTX = 2048, 22, 32, 4, 5632, 32000, 2048
HEAD_DIM = HIDDEN // HEADS


def vocab():
    """<unk>, <s>, </s>, the 256 byte tokens, then plain pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # unknown, control, control, byte
    for i in range(VOCAB - len(tokens)):
        tokens.append(f"\u2581w{i}")
        types.append(1)  # normal
    scores = [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(VOCAB - 259)]
    return tokens, scores, types


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--type", default="Q4_1", choices=["Q4_0", "Q4_1", "Q8_0", "F16"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    qtype = T[args.type]
    rng = np.random.default_rng(args.seed)

    w = gguf.GGUFWriter(args.out, "llama")
    w.add_name("tinyllama-shape-random")
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{args.type}"]))
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def weight(name, rows, cols):
        x = rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)
        data = x.astype(np.float16) if qtype == T.F16 else quantize(x, qtype)
        w.add_tensor(name, data, raw_dtype=qtype)

    def norm(name):
        w.add_tensor(name, np.ones(HIDDEN, dtype=np.float32))

    weight("token_embd.weight", VOCAB, HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight")
        weight(p + "attn_q.weight", HIDDEN, HIDDEN)
        weight(p + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        weight(p + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        weight(p + "attn_output.weight", HIDDEN, HIDDEN)
        norm(p + "ffn_norm.weight")
        weight(p + "ffn_gate.weight", INTER, HIDDEN)
        weight(p + "ffn_up.weight", INTER, HIDDEN)
        weight(p + "ffn_down.weight", HIDDEN, INTER)
        print(f"layer {i + 1}/{LAYERS}", flush=True)
    norm("output_norm.weight")
    weight("output.weight", VOCAB, HIDDEN)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()


if __name__ == "__main__":
    main()
