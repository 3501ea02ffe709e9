#!/usr/bin/env python3
"""Writes a GGUF file with a real model's shape (Mixture-of-Experts, or Qwen3.5's hybrid) and random weights, for
speed and memory measurements on models whose weights never reach this machine.

    --shape qwen3-30b-a3b   Qwen3-30B-A3B: hidden 2048, 48 layers, 32 q / 4 KV heads of
                            128, 128 experts of 768 (top 8, renormalised), vocabulary
                            151,936; llama.cpp's Q4_K_M formats: q, k, o and the experts'
                            gate and up in Q4_K, v and the experts' down in Q6_K, the
                            router in f32, embeddings Q4_K, output Q6_K.
    --shape gpt-oss-20b     gpt-oss-20b: hidden 2880, 24 layers, 64 q / 8 KV heads of 64,
                            32 experts of 2880 (top 4, softmax over the top logits) with
                            biases, attention sinks, every other layer sliding (window
                            128), YaRN (factor 32 over 4,096); llama.cpp's MXFP4_MOE
                            formats: the experts MXFP4, the other matrices Q8_0, norms,
                            biases, sinks and the router f32. The vocabulary is the
                            tokenizer file's (o200k's 201,088 tokens do not reach this
                            machine: with Qwen2.5's 151,936 the embeddings and output are
                            a quarter smaller than the real model's).
    --shape qwen3.5-0.8b    Qwen3.5-0.8B (dense, hybrid): hidden 1024, 24 layers, three
                            Gated DeltaNet layers (16 key and 16 value heads of 128,
                            convolution width 4) to one gated full-attention layer (8 q /
                            2 KV heads of 256, RoPE over 64 dims), MLP 3,584, tied
                            embeddings; as its public config.json gives it, in llama.cpp's
                            `qwen35` layout; Q4_K_M-like formats (Q4_K, v and down Q6_K,
                            embeddings Q6_K, the DeltaNet's b/a projections, convolution,
                            decay and norms f32). The vocabulary is the tokenizer file's
                            (Qwen3.5's 248,320 tokens do not reach this machine).
    --shape gemma4-e2b      Gemma 4 E2B (text): hidden 1536, 35 layers, four sliding layers
                            (8 q / 1 KV heads of 256, window 512) to one full (heads of
                            512, proportional RoPE over a quarter of the pairs), the last 20
                            layers reading the K/V of layers 13 and 14 with MLPs twice as
                            wide (6,144 and 12,288), per-layer inputs 256 wide (a 262,144 x
                            35 x 256 table), logits soft-capped at 30, tied embeddings; as
                            its public config.json gives it, in llama.cpp's `gemma4`
                            layout; Q4_K_M-like formats (Q4_K, v and down Q6_K, embeddings
                            Q6_K, the per-layer table Q4_K). The vocabulary is the
                            tokenizer file's: Gemma 3's (gemma-3-270m) has Gemma 4's size,
                            262,144.
    --shape tiny            a 2-layer Qwen3-MoE of hidden 256 with 8 experts of 256 (top
                            2) in the same formats, with the vocabulary of whatever file
                            the tokenizer comes from: what the Python tests run through
                            every entry point (tests/python/test_moe.py).
    --shape gpt-oss-tiny    the same size as gpt-oss (2 layers, the first sliding over 128,
                            sinks, biases, MXFP4 experts, YaRN), for the same tests.

Weights are random blocks (scales chosen so that each row's dot products stay near unit
size), so the text is noise but every kernel reads and computes what the real file makes
it read and compute; random router weights spread tokens over the experts about evenly,
as real traffic does. The tokenizer (and chat template) comes from another GGUF file with
the same vocabulary (Qwen2.5's 151,936 tokens: `minivllm download-model
qwen2.5-coder-0.5b`). Tensors are written one at a time, so a file larger than memory
can be made.

    .venv/bin/python scripts/make_moe_bench_gguf.py --layers 12 \\
        --tokenizer-from models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \\
        --out models/bench/qwen3-30b-a3b-shape-12l.Q4_K_M.gguf

Needs numpy and gguf (both in tests/python/requirements.txt, so `.venv` has them).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

SHAPES = {
    "qwen3-30b-a3b": dict(
        arch="qwen3moe",
        hidden=2048,
        layers=48,
        heads=32,
        kv_heads=4,
        head_dim=128,
        experts=128,
        experts_used=8,
        expert_ffn=768,
        ffn=6144,
        vocab=151936,
        context=40960,
        rope_theta=1_000_000.0,
        eps=1e-6,
    ),
    "gpt-oss-20b": dict(
        arch="gpt-oss",
        hidden=2880,
        layers=24,
        heads=64,
        kv_heads=8,
        head_dim=64,
        experts=32,
        experts_used=4,
        expert_ffn=2880,
        ffn=2880,
        vocab=None,  # the tokenizer's (see above)
        context=131072,
        rope_theta=150_000.0,
        eps=1e-5,
        sliding_window=128,
        yarn=(32.0, 4096),
    ),
}
SHAPES["qwen3.5-0.8b"] = dict(
    arch="qwen35",
    hidden=1024,
    layers=24,
    heads=8,
    kv_heads=2,
    head_dim=256,
    ffn=3584,
    vocab=None,
    context=262144,
    rope_theta=10_000_000.0,
    eps=1e-6,
    linear=dict(k_heads=16, v_heads=16, k_dim=128, v_dim=128, conv=4, every=4),
)
SHAPES["gemma4-e2b"] = dict(
    arch="gemma4",
    hidden=1536,
    layers=35,
    heads=8,
    kv_heads=1,
    head_dim=256,
    ffn=6144,
    vocab=262144,
    context=131072,
    rope_theta=1_000_000.0,
    eps=1e-6,
    sliding_window=512,
    gemma4=dict(full_head_dim=512, every=5, shared=20, per_layer=256, softcap=30.0,
                rope_theta_swa=10_000.0, rope_fraction=0.25),
)
# Two-layer models of the same families, for the tests' quick runs: the real shape with small
# widths (the tokenizer's vocabulary, as the real ones).
_TINY = dict(hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, experts=8, experts_used=2,
             expert_ffn=256, context=4096, vocab=None)
SHAPES["gpt-oss-tiny"] = {**SHAPES["gpt-oss-20b"], **_TINY, "ffn": 256}
SHAPES["tiny"] = {**SHAPES["qwen3-30b-a3b"], **_TINY, "ffn": 512}

BLOCK_BYTES = {T.Q4_K: 144, T.Q6_K: 210, T.Q8_0: 34, T.MXFP4: 17}
BLOCK_VALUES = {T.Q4_K: 256, T.Q6_K: 256, T.Q8_0: 32, T.MXFP4: 32}


def random_blocks(rng, ty, rows, cols):
    """`rows` rows of `cols` values as random `ty` blocks whose dequantised rows have
    entries of about 1/sqrt(cols) (so a dot product with a unit-RMS input is about 1)."""
    nb = rows * cols // BLOCK_VALUES[ty]
    blocks = rng.integers(0, 256, size=(nb, BLOCK_BYTES[ty]), dtype=np.uint8)
    target = 1.0 / np.sqrt(cols)
    if ty == T.MXFP4:
        # w = 2^(e - 128) * code, codes 0-12 in magnitude (about 5 on average).
        e = np.round(128 + np.log2(target / 5)).astype(np.int64)
        blocks[:, 0] = rng.integers(e - 1, e + 2, nb).astype(np.uint8)
    elif ty == T.Q8_0:
        # w = d * q, q uniform in ±127 (RMS about 73).
        d = (rng.uniform(0.5, 1.5, nb) * target / 73).astype(np.float16)
        blocks[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
    elif ty == T.Q4_K:
        # w = d * scale * q - dmin * min, scale and min 6-bit, q 4-bit: about d * 32 * 8.
        d = (rng.uniform(0.5, 1.5, nb) * target / 256).astype(np.float16)
        blocks[:, 0:2] = d.view(np.uint8).reshape(nb, 2)
        blocks[:, 2:4] = d.view(np.uint8).reshape(nb, 2)
    else:
        # Q6_K: ql[128] qh[64] scales[16] (int8) d: w = d * scale * (q - 32).
        blocks[:, 192:208] = rng.integers(-16, 17, size=(nb, 16), dtype=np.int8).view(np.uint8)
        d = (rng.uniform(0.5, 1.5, nb) * target / (8 * 16)).astype(np.float16)
        blocks[:, 208:210] = d.view(np.uint8).reshape(nb, 2)
    return blocks


def tensors(s, layers):
    """(name, PyTorch-order shape, type) of every tensor, in llama.cpp's order."""
    if s["arch"] == "gpt-oss":
        yield from gpt_oss_tensors(s, layers)
        return
    if s["arch"] == "qwen35":
        yield from qwen35_tensors(s, layers)
        return
    if s["arch"] == "gemma4":
        yield from gemma4_tensors(s, layers)
        return
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    e, f = s["experts"], s["expert_ffn"]
    yield "token_embd.weight", (s["vocab"], h), T.Q4_K
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), T.F32
        yield b + "attn_q.weight", (q, h), T.Q4_K
        yield b + "attn_k.weight", (kv, h), T.Q4_K
        yield b + "attn_v.weight", (kv, h), T.Q6_K
        yield b + "attn_output.weight", (h, q), T.Q4_K
        yield b + "attn_q_norm.weight", (s["head_dim"],), T.F32
        yield b + "attn_k_norm.weight", (s["head_dim"],), T.F32
        yield b + "ffn_norm.weight", (h,), T.F32
        yield b + "ffn_gate_inp.weight", (e, h), T.F32
        yield b + "ffn_gate_exps.weight", (e, f, h), T.Q4_K
        yield b + "ffn_up_exps.weight", (e, f, h), T.Q4_K
        yield b + "ffn_down_exps.weight", (e, h, f), T.Q6_K
    yield "output_norm.weight", (h,), T.F32
    yield "output.weight", (s["vocab"], h), T.Q6_K


def gpt_oss_tensors(s, layers):
    """gpt-oss's tensors (`convert_hf_to_gguf.py`'s names) in MXFP4_MOE's formats."""
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    e, f = s["experts"], s["expert_ffn"]
    yield "token_embd.weight", (s["vocab"], h), T.Q8_0
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), T.F32
        for name, rows in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)]:
            yield b + name + ".weight", (rows, h), T.Q8_0
            yield b + name + ".bias", (rows,), T.F32
        yield b + "attn_output.weight", (h, q), T.Q8_0
        yield b + "attn_output.bias", (h,), T.F32
        yield b + "attn_sinks.weight", (s["heads"],), T.F32
        yield b + "post_attention_norm.weight", (h,), T.F32
        yield b + "ffn_gate_inp.weight", (e, h), T.F32
        yield b + "ffn_gate_inp.bias", (e,), T.F32
        for name, rows, cols in [("ffn_gate_exps", f, h), ("ffn_up_exps", f, h), ("ffn_down_exps", h, f)]:
            yield b + name + ".weight", (e, rows, cols), T.MXFP4
            yield b + name + ".bias", (e, rows), T.F32
    yield "output_norm.weight", (h,), T.F32
    yield "output.weight", (s["vocab"], h), T.Q8_0


def qwen35_tensors(s, layers):
    """Qwen3.5's tensors (`convert_hf_to_gguf.py`'s names): DeltaNet layers and, every
    `every`-th layer, gated full attention (q rows doubled for the gate)."""
    h, q, kv = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    lin = s["linear"]
    key, value = lin["k_heads"] * lin["k_dim"], lin["v_heads"] * lin["v_dim"]
    conv = 2 * key + value
    yield "token_embd.weight", (s["vocab"], h), T.Q6_K
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (h,), T.F32
        if (i + 1) % lin["every"]:
            yield b + "attn_qkv.weight", (conv, h), T.Q4_K
            yield b + "attn_gate.weight", (value, h), T.Q4_K
            yield b + "ssm_beta.weight", (lin["v_heads"], h), T.F32
            yield b + "ssm_alpha.weight", (lin["v_heads"], h), T.F32
            yield b + "ssm_conv1d.weight", (conv, lin["conv"]), T.F32
            yield b + "ssm_dt.bias", (lin["v_heads"],), T.F32
            yield b + "ssm_a", (lin["v_heads"],), T.F32
            yield b + "ssm_norm.weight", (lin["v_dim"],), T.F32
            yield b + "ssm_out.weight", (h, value), T.Q4_K
        else:
            yield b + "attn_q.weight", (2 * q, h), T.Q4_K
            yield b + "attn_k.weight", (kv, h), T.Q4_K
            yield b + "attn_v.weight", (kv, h), T.Q6_K
            yield b + "attn_output.weight", (h, q), T.Q4_K
            yield b + "attn_q_norm.weight", (s["head_dim"],), T.F32
            yield b + "attn_k_norm.weight", (s["head_dim"],), T.F32
        yield b + "post_attention_norm.weight", (h,), T.F32
        yield b + "ffn_gate.weight", (s["ffn"], h), T.Q4_K
        yield b + "ffn_up.weight", (s["ffn"], h), T.Q4_K
        yield b + "ffn_down.weight", (h, s["ffn"]), T.Q6_K
    yield "output_norm.weight", (h,), T.F32


def gemma4_is_full(s, i, layers):
    """Whether layer `i` is a full-attention layer (every `every`-th, and the last)."""
    return (i + 1) % s["gemma4"]["every"] == 0 or i == layers - 1


def gemma4_ffn(s, i, layers):
    g = s["gemma4"]
    return s["ffn"] * 2 if i >= layers - g["shared"] else s["ffn"]


def gemma4_tensors(s, layers):
    """Gemma 4's tensors (`convert_hf_to_gguf.py`'s names): per-layer inputs, layers past
    `layers - shared` with q only (they read earlier layers' K/V), full layers with their own
    head size."""
    g = s["gemma4"]
    h, p = s["hidden"], g["per_layer"]
    yield "rope_freqs.weight", (g["full_head_dim"] // 2,), T.F32
    yield "token_embd.weight", (s["vocab"], h), T.Q6_K
    yield "per_layer_token_embd.weight", (s["vocab"], layers * p), T.Q4_K
    yield "per_layer_model_proj.weight", (layers * p, h), T.Q4_K
    yield "per_layer_proj_norm.weight", (p,), T.F32
    for i in range(layers):
        b = f"blk.{i}."
        d = g["full_head_dim"] if gemma4_is_full(s, i, layers) else s["head_dim"]
        q, kv, f = s["heads"] * d, s["kv_heads"] * d, gemma4_ffn(s, i, layers)
        yield b + "attn_norm.weight", (h,), T.F32
        yield b + "attn_q.weight", (q, h), T.Q4_K
        yield b + "attn_q_norm.weight", (d,), T.F32
        if i < layers - g["shared"]:
            yield b + "attn_k.weight", (kv, h), T.Q4_K
            yield b + "attn_v.weight", (kv, h), T.Q6_K
            yield b + "attn_k_norm.weight", (d,), T.F32
        yield b + "attn_output.weight", (h, q), T.Q4_K
        yield b + "post_attention_norm.weight", (h,), T.F32
        yield b + "ffn_norm.weight", (h,), T.F32
        yield b + "ffn_gate.weight", (f, h), T.Q4_K
        yield b + "ffn_up.weight", (f, h), T.Q4_K
        yield b + "ffn_down.weight", (h, f), T.Q6_K
        yield b + "post_ffw_norm.weight", (h,), T.F32
        yield b + "inp_gate.weight", (p, h), T.Q4_K
        yield b + "proj.weight", (h, p), T.Q4_K
        yield b + "post_norm.weight", (h,), T.F32
        yield b + "layer_output_scale.weight", (1,), T.F32
    yield "output_norm.weight", (h,), T.F32


def data(rng, name, shape, ty):
    if name == "rope_freqs.weight":  # Gemma 4's proportional RoPE: a quarter of the pairs turn
        turning = int(shape[0] * SHAPES["gemma4-e2b"]["gemma4"]["rope_fraction"])
        return np.where(np.arange(shape[0]) < turning, 1.0, 1e30).astype(np.float32)
    if name.endswith("ssm_a"):  # -exp(A_log): decay rates from 1 to 16
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if ty == T.F32:
        if name.endswith(".bias") or "sinks" in name:  # small offsets
            return rng.uniform(-0.1, 0.1, shape).astype(np.float32)
        if len(shape) == 1:  # norms: around 1
            return rng.uniform(0.8, 1.2, shape).astype(np.float32)
        return (rng.uniform(-1, 1, shape) * np.sqrt(3.0 / shape[-1])).astype(np.float32)
    rows = int(np.prod(shape[:-1]))
    return random_blocks(rng, ty, rows, shape[-1])


def copy_tokenizer(writer, reader):
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, vtype)


def write(shape, layers, tokenizer_from, out, seed=0, progress=False):
    """Writes the file; `layers` None for the model's own count."""
    s = dict(SHAPES[shape])
    layers = layers or s["layers"]
    tokenizer = gguf.GGUFReader(tokenizer_from)
    vocab = len(tokenizer.fields["tokenizer.ggml.tokens"].contents())
    if s["vocab"] is None:
        s["vocab"] = vocab
    elif s["vocab"] != vocab:
        sys.exit(f"{tokenizer_from} has {vocab} tokens, {shape} needs {s['vocab']}")
    rng = np.random.default_rng(seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)

    w = gguf.GGUFWriter(out, s["arch"])
    w.add_name(f"random {shape} shape, {layers} layers")
    w.add_context_length(s["context"])
    w.add_embedding_length(s["hidden"])
    if "gemma4" not in s:  # per layer, below
        w.add_feed_forward_length(s["ffn"])
    w.add_block_count(layers)
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    if "gemma4" not in s:
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["experts_used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    if "linear" in s:
        lin = s["linear"]
        w.add_ssm_conv_kernel(lin["conv"])
        w.add_ssm_state_size(lin["k_dim"])
        w.add_ssm_group_count(lin["k_heads"])
        w.add_ssm_time_step_rank(lin["v_heads"])
        w.add_ssm_inner_size(lin["v_heads"] * lin["v_dim"])
        w.add_full_attention_interval(lin["every"])
        w.add_rope_dimension_count(s["head_dim"] // 4)
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if "sliding_window" in s:
        w.add_sliding_window(s["sliding_window"])
    if "gemma4" in s:
        g, a = s["gemma4"], s["arch"]
        w.add_array(f"{a}.feed_forward_length", [gemma4_ffn(s, i, layers) for i in range(layers)])
        w.add_key_length(g["full_head_dim"])
        w.add_value_length(g["full_head_dim"])
        w.add_uint32(f"{a}.attention.key_length_swa", s["head_dim"])
        w.add_uint32(f"{a}.attention.value_length_swa", s["head_dim"])
        w.add_uint32(f"{a}.rope.dimension_count", g["full_head_dim"])
        w.add_uint32(f"{a}.rope.dimension_count_swa", s["head_dim"])
        w.add_float32(f"{a}.rope.freq_base_swa", g["rope_theta_swa"])
        w.add_uint32(f"{a}.attention.shared_kv_layers", g["shared"])
        w.add_uint32(f"{a}.embedding_length_per_layer_input", g["per_layer"])
        w.add_array(f"{a}.attention.sliding_window_pattern",
                    [not gemma4_is_full(s, i, layers) for i in range(layers)])
        w.add_float32(f"{a}.final_logit_softcapping", g["softcap"])
    if "yarn" in s:
        factor, original = s["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    else:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    copy_tokenizer(w, tokenizer)

    specs = list(tensors(s, layers))
    for name, shape_, ty in specs:
        if ty == T.F32:
            w.add_tensor_info(name, shape_, np.float32, int(np.prod(shape_)) * 4, raw_dtype=ty)
        else:
            # gguf-py takes a quantised tensor's shape in bytes per row.
            byte_shape = (*shape_[:-1], shape_[-1] // BLOCK_VALUES[ty] * BLOCK_BYTES[ty])
            nbytes = int(np.prod(byte_shape))
            w.add_tensor_info(name, byte_shape, np.uint8, nbytes, raw_dtype=ty)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for i, (name, shape_, ty) in enumerate(specs):
        t = data(rng, name, shape_, ty)
        w.write_tensor_data(t)
        total += t.nbytes
        if progress:
            print(f"\r{i + 1}/{len(specs)} tensors, {total / 1e9:.2f} GB", end="", file=sys.stderr)
    w.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, help="layers to write (default: the model's)")
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF with the same vocabulary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = write(args.shape, args.layers, args.tokenizer_from, args.out, args.seed, progress=True)
    print(f"\nwrote {out} ({out.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)


if __name__ == "__main__":
    main()
