#!/usr/bin/env python3
"""Writes a Hugging Face folder with Qwen3-30B-A3B's shape and random bf16 weights, for
comparing engines that load such folders (vLLM-CPU) on a Mixture-of-Experts model whose
weights never reach this machine.

The shape is Qwen3-30B-A3B's public config.json (hidden 2048, 32 q / 4 KV heads of 128,
q/k norms, 128 experts of 768, top 8 renormalised, no shared expert, vocabulary 151,936,
untied output) at `--layers` of its 48 layers. Weights are N(0, 0.02) in bfloat16, norms
1: the text is noise, but every engine reads and computes what the real folder makes it
read and compute, and the random router spreads tokens over the experts about evenly, as
real traffic does. Tensors go under the hub's names (one tensor per expert matrix), one
safetensors shard per layer, so the folder is written without holding it in memory
(`save_pretrained` of the whole model needs about three times its size). The tokenizer
and chat template come from a GGUF file with the same vocabulary (Qwen2.5's:
`minivllm download-model qwen2.5-coder-0.5b`).

    python scripts/make_moe_bench_hf.py --layers 8 \\
        --tokenizer-from models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \\
        --out models/bench/qwen3-30b-a3b-shape-8l-hf

The shape's numbers are make_moe_bench_gguf.py's (imported, so numpy and gguf are needed
too). Needs torch, safetensors and transformers (with gguf): vllm-peer.sh's environment has
them.
8 layers make 11.2 GB.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).parent))
from make_moe_bench_gguf import SHAPES  # noqa: E402  (one owner of the shape)

S = SHAPES["qwen3-30b-a3b"]
CONFIG = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    vocab_size=S["vocab"],
    hidden_size=S["hidden"],
    intermediate_size=S["ffn"],
    moe_intermediate_size=S["expert_ffn"],
    num_attention_heads=S["heads"],
    num_key_value_heads=S["kv_heads"],
    head_dim=S["head_dim"],
    num_experts=S["experts"],
    num_experts_per_tok=S["experts_used"],
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    output_router_logits=False,
    router_aux_loss_coef=0.001,
    hidden_act="silu",
    rms_norm_eps=S["eps"],
    rope_theta=S["rope_theta"],
    rope_scaling=None,
    max_position_embeddings=S["context"],
    max_window_layers=S["layers"],
    sliding_window=None,
    use_sliding_window=False,
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_id=151645,
    torch_dtype="bfloat16",
    use_cache=True,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokenizer-from", required=True, help="a GGUF with Qwen2.5's vocabulary")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)
    c = dict(CONFIG, num_hidden_layers=args.layers)
    h, v, hd = c["hidden_size"], c["vocab_size"], c["head_dim"]
    q, kv, ff = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, c["moe_intermediate_size"]

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    index = {}
    total = 0

    def shard(name, tensors):
        nonlocal total
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        for k, t in tensors.items():
            index[k] = name
            total += t.numel() * t.element_size()
        print(f"{name}: {len(tensors)} tensors, {total / 1e9:.2f} GB so far", flush=True)

    shard("embed.safetensors", {"model.embed_tokens.weight": rand(v, h)})
    for i in range(args.layers):
        p = f"model.layers.{i}."
        t = {
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
            p + "self_attn.q_proj.weight": rand(q, h),
            p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h),
            p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": ones(hd),
            p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate.weight": rand(c["num_experts"], h),
        }
        for e in range(c["num_experts"]):
            x = f"{p}mlp.experts.{e}."
            t[x + "gate_proj.weight"] = rand(ff, h)
            t[x + "up_proj.weight"] = rand(ff, h)
            t[x + "down_proj.weight"] = rand(h, ff)
        shard(f"layer-{i:02}.safetensors", t)
    shard("head.safetensors", {"model.norm.weight": ones(h), "lm_head.weight": rand(v, h)})

    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1)
    )
    (out / "config.json").write_text(json.dumps(c, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": c["bos_token_id"], "eos_token_id": [151645, 151643]})
    )
    from transformers import AutoTokenizer

    src = Path(args.tokenizer_from)
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    tok.save_pretrained(str(out))
    print(f"wrote {out}: {args.layers} layers, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
