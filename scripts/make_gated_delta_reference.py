#!/usr/bin/env python3
"""Writes the kernels' transformers reference for Gated DeltaNet (Qwen3-Next, Qwen3.5):
transformers' own `torch_recurrent_gated_delta_rule`, `torch_chunk_gated_delta_rule` (with
`use_qk_l2norm_in_kernel`, as both families call them) and `causal_conv1d_fn` (SiLU) on small
random inputs, two key heads read by four value heads, 70 tokens (past one chunk of 64) from
a non-zero state.

    python scripts/make_gated_delta_reference.py   # a Python with torch and transformers 5.x

Output: crates/minivllm-kernels/src/gated_delta/transformers.txt, one array per line
(`name v0 v1 ...`, float32 values), read by the kernels' tests; and
crates/minivllm/src/model_executor/layers/gated_delta_net/qwen3_5.txt, a whole
`Qwen3_5GatedDeltaNet` layer (random weights, one per line as `name d0xd1 v0 v1 ...`, then
its input `x` and output `y` for 13 tokens), read by the layer's tests.
"""

import pathlib

import torch
import transformers
from transformers.models.qwen3_next import modeling_qwen3_next as m

T, NK, NV, KD, VD = 70, 2, 4, 8, 6
CHANNELS, WIDTH = 10, 4


def main():
    torch.manual_seed(0)
    q = torch.randn(1, T, NK, KD)
    k = torch.randn(1, T, NK, KD)
    v = torch.randn(1, T, NV, VD)
    g = -torch.rand(1, T, NV) * 1.5
    beta = torch.rand(1, T, NV)
    state0 = torch.randn(1, NV, KD, VD) * 0.3
    # Each group of value heads reads one key head, as the layer repeats them.
    rep = NV // NK
    qr, kr = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    rec_out, rec_state = m.torch_recurrent_gated_delta_rule(
        qr, kr, v, g, beta, initial_state=state0.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    chunk_out, chunk_state = m.torch_chunk_gated_delta_rule(
        qr, kr, v, g, beta, initial_state=state0.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    x = torch.randn(1, CHANNELS, T)
    weight = torch.randn(CHANNELS, WIDTH)
    bias = torch.randn(CHANNELS)
    conv = m.causal_conv1d_fn(x, weight, bias, activation="silu")

    arrays = {
        "shape": torch.tensor([T, NK, NV, KD, VD], dtype=torch.float32),
        "q": q, "k": k, "v": v, "g": g, "beta": beta, "state0": state0,
        "recurrent_out": rec_out, "recurrent_state": rec_state,
        "chunked_out": chunk_out, "chunked_state": chunk_state,
        "conv_shape": torch.tensor([CHANNELS, WIDTH], dtype=torch.float32),
        # The kernels take tokens first: [t, channels].
        "conv_x": x[0].T, "conv_weight": weight, "conv_bias": bias, "conv_out": conv[0].T,
    }
    out = pathlib.Path(__file__).resolve().parent.parent / (
        "crates/minivllm-kernels/src/gated_delta/transformers.txt")
    with open(out, "w") as f:
        f.write(f"# transformers {transformers.__version__}, torch {torch.__version__}: "
                "scripts/make_gated_delta_reference.py\n")
        for name, a in arrays.items():
            vals = a.detach().to(torch.float32).contiguous().reshape(-1).tolist()
            # Nine significant digits give back every float32 exactly.
            f.write(name + " " + " ".join(format(x, ".9g") for x in vals) + "\n")
    print(f"wrote {out}")
    layer_fixture()


def layer_fixture():
    """A Qwen3.5 Gated DeltaNet layer with random weights, on 13 tokens from a zero state."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q35

    torch.manual_seed(1)
    config = Qwen3_5TextConfig(
        hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
        num_hidden_layers=1, layer_types=["linear_attention"], hidden_act="silu",
        rms_norm_eps=1e-6)
    layer = q35.Qwen3_5GatedDeltaNet(config, 0).eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.empty_like(p).uniform_(1.0, 4.0).log())
            elif name == "norm.weight":
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
        x = torch.randn(1, 13, config.hidden_size)
        y = layer(x)
    out = pathlib.Path(__file__).resolve().parent.parent / (
        "crates/minivllm/src/model_executor/layers/gated_delta_net/qwen3_5.txt")
    out.parent.mkdir(exist_ok=True)
    with open(out, "w") as f:
        f.write(f"# transformers {transformers.__version__} Qwen3_5GatedDeltaNet: "
                "scripts/make_gated_delta_reference.py\n")
        tensors = [(f"model.layers.0.linear_attn.{n}", p) for n, p in layer.named_parameters()]
        for name, a in tensors + [("x", x[0]), ("y", y[0])]:
            shape = "x".join(str(d) for d in a.shape)
            vals = a.detach().to(torch.float32).contiguous().reshape(-1).tolist()
            f.write(f"{name} {shape} " + " ".join(format(v, ".9g") for v in vals) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
