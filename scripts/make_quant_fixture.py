#!/usr/bin/env python3
"""Writes crates/minivllm-kernels/tests/fixtures/quant_fixture.gguf.fixture (a GGUF file; the suffix keeps it apart from model files).

The fixture pins our dequantisation to gguf-py's (itself a port of ggml's reference
dequantize_row_*). For every GGML type we dequantise it holds `<TYPE>.q`, a small tensor
of that type, and `<TYPE>.expected`, the F32 values gguf-py decodes it to.
crates/minivllm/tests/gguf_dequant.rs compares the two through our GGUF reader.

Types gguf-py can quantize get quantized random normal data (MXFP4: gpt-oss's experts). For the K-quants, which it
cannot, the blocks are random bytes with their f16 scale fields replaced by finite values,
so every bit of the quant fields is exercised. Q8_K has no dequantizer in gguf-py; its
expected values are computed here from ggml's definition (f32 d times each i8 quant).

Rerun (needs `pip install gguf numpy`; the output is deterministic for a gguf-py version):
    python3 scripts/make_quant_fixture.py
"""

import importlib.metadata
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

SEED = 20240531
OUT = Path(__file__).resolve().parent.parent / "crates/minivllm-kernels/tests/fixtures/quant_fixture.gguf.fixture"

# Byte offsets of the f16 scale fields inside one block; random bytes there could be NaN/inf.
K_SCALE_OFFSETS = {
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
QUANTIZABLE = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]
ROWS = 2


def random_k_blocks(rng: np.random.Generator, qtype: T, cols: int) -> np.ndarray:
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * cols // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in K_SCALE_OFFSETS.get(qtype, []):
        scales = rng.uniform(-2.0, 2.0, size=n_blocks).astype(np.float16)
        blocks[:, off : off + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
    if qtype == T.Q8_K:
        blocks[:, 0:4] = rng.uniform(-0.1, 0.1, size=n_blocks).astype(np.float32).view(np.uint8).reshape(n_blocks, 4)
    return blocks.reshape(ROWS, -1)


def dequantize_q8_k(rows: np.ndarray) -> np.ndarray:
    blocks = rows.reshape(-1, 292)
    d = blocks[:, 0:4].copy().view(np.float32)
    qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return (qs * d).reshape(ROWS, -1)


def main() -> None:
    rng = np.random.default_rng(SEED)
    writer = gguf.GGUFWriter(str(OUT), "fixture")
    writer.add_uint32("fixture.seed", SEED)
    writer.add_string("fixture.gguf_py_version", importlib.metadata.version("gguf"))

    for qtype in QUANTIZABLE:
        cols = 64
        data = rng.standard_normal((ROWS, cols)).astype(np.float32)
        q = quantize(data, qtype)
        expected = dequantize(q, qtype).astype(np.float32)
        writer.add_tensor(f"{qtype.name}.q", q, raw_dtype=qtype)
        writer.add_tensor(f"{qtype.name}.expected", expected)

    for qtype in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]:
        q = random_k_blocks(rng, qtype, cols=512)
        expected = dequantize_q8_k(q) if qtype == T.Q8_K else dequantize(q, qtype)
        expected = expected.astype(np.float32)
        assert np.isfinite(expected).all(), qtype.name
        writer.add_tensor(f"{qtype.name}.q", q, raw_dtype=qtype)
        writer.add_tensor(f"{qtype.name}.expected", expected)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
