#!/usr/bin/env python3
"""Writes the kernels' transformers reference for Gated DeltaNet (Qwen3-Next, Qwen3.5):
transformers' own `torch_recurrent_gated_delta_rule`, `torch_chunk_gated_delta_rule` (with
`use_qk_l2norm_in_kernel`, as both families call them) and `causal_conv1d_fn` (SiLU) on small
random inputs, two key heads read by four value heads, 70 tokens (past one chunk of 64) from
a non-zero state.

    python scripts/make_gated_delta_reference.py   # a Python with torch and transformers 5.x

Output: crates/minivllm-kernels/src/gated_delta/transformers.txt, one array per line
(`name v0 v1 ...`, float32 values), read by the kernels' tests.
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


if __name__ == "__main__":
    main()
