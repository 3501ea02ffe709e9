//! The Mixture-of-Experts tiny models read from GGUF files in llama.cpp's layout, as its
//! `convert_hf_to_gguf.py` writes them (checked tensor by tensor against the converter's
//! own output, `scripts/check_tiny_gguf_layout.py`): every expert's gate, up and down
//! stacked in one 3-D tensor per layer (`ffn_gate_exps` `[experts, width, hidden]`), the
//! router as `ffn_gate_inp`, Qwen2-MoE's shared expert as `ffn_*_shexp` with its gate
//! `ffn_gate_inp_shexp` `[1, hidden]`, the `<arch>.expert_*` keys, Mixtral under `llama` with
//! its q/k rows permuted; gpt-oss's expert biases as `ffn_*_exps.bias` `[experts, rows]`,
//! its sinks as `attn_sinks`, its MLP norm as `post_attention_norm`. In f32 the file gives transformers' logits; with the experts in
//! Q4_0 (and the rest in llama.cpp's formats) it gives, to the bit, what the same weights
//! re-quantised from the Hugging Face names give: so each expert's slice of a 3-D quantised
//! tensor is that expert's rows.

use std::collections::BTreeMap;

use minivllm::config::{KvCacheLayout, ModelConfig, ModelFamily, RopeScaling};
use minivllm::model_executor::loader::fused::UnfusedSource;
use minivllm::model_executor::loader::gguf::{GgufFile, GgufValue};
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use minivllm::model_executor::loader::gguf_writer::{write_gguf, TensorEntry};
use minivllm::model_executor::loader::weights::{LoadOptions, Quantization, WeightSource};
use minivllm::model_executor::models::llama::LlamaForCausalLM;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::ModelRunner;
use minivllm_kernels::attention::KvCacheDtype;
use minivllm_kernels::qdot::quantize_to;
use minivllm_kernels::quant::GgmlType;

use super::model_families::{assert_close, cases, step, BLOCK_SIZE};
use super::tiny_models::{self, TinyWeights};

const MOE_FAMILIES: [&str; 5] = ["qwen3moe", "qwen2moe", "mixtral", "olmoe", "gptoss"];

/// A tensor to write: its GGUF name, PyTorch-order shape, f32 values.
struct Out {
    name: String,
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// llama.cpp's name for a per-layer tensor of the Hugging Face checkpoint; `None` for the
/// experts, which go into the 3-D tensors.
fn gguf_part(family: &str, part: &str) -> Option<&'static str> {
    Some(match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" if family == "gptoss" => "post_attention_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.o_proj.bias" => "attn_output.bias",
        "self_attn.sinks" => "attn_sinks.weight",
        "mlp.router.weight" => "ffn_gate_inp.weight",
        "mlp.router.bias" => "ffn_gate_inp.bias",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.q_proj.bias" => "attn_q.bias",
        "self_attn.k_proj.bias" => "attn_k.bias",
        "self_attn.v_proj.bias" => "attn_v.bias",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate.weight" | "block_sparse_moe.gate.weight" => "ffn_gate_inp.weight",
        "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
        "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    })
}

/// The converter's q/k row order for llama.cpp's `llama` graph: each head's rotate-half
/// pairs `(i, i + d/2)` made adjacent.
fn permute_rows(data: &[f32], rows: usize, heads: usize) -> Vec<f32> {
    let cols = data.len() / rows;
    let d = rows / heads;
    let mut out = vec![0.0; data.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                let (dst, src) = (h * d + 2 * i + j, h * d + j * d / 2 + i);
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The tiny model's tensors under llama.cpp's names and layout.
fn gguf_tensors(family: &str, c: &ModelConfig) -> Vec<Out> {
    let hf = TinyWeights::of(family);
    // gpt-oss's stacked experts seen per expert, as the converter cuts them.
    let per_expert = UnfusedSource::new(&hf, c);
    let moe = c.moe.as_ref().unwrap();
    let load = |name: &str| per_expert.load(name).unwrap();
    let mut out = Vec::new();
    for (name, gguf) in [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ] {
        let t = load(name);
        out.push(Out {
            name: gguf.into(),
            shape: t.shape,
            data: t.data,
        });
    }
    for layer in 0..c.num_hidden_layers {
        let prefix = format!("model.layers.{layer}.");
        for name in hf.names().filter(|n| n.starts_with(&prefix)) {
            let Some(part) = gguf_part(family, &name[prefix.len()..]) else {
                continue;
            };
            let t = load(name);
            let (shape, mut data) = (t.shape, t.data);
            if family == "mixtral" && part == "attn_q.weight" {
                data = permute_rows(&data, shape[0], c.num_attention_heads);
            } else if family == "mixtral" && part == "attn_k.weight" {
                data = permute_rows(&data, shape[0], c.num_key_value_heads);
            }
            out.push(Out {
                name: format!("blk.{layer}.{part}"),
                shape,
                data,
            });
        }
        if !moe.is_moe_layer(layer) {
            continue;
        }
        let (block, projs) = if family == "mixtral" {
            ("block_sparse_moe", ["w1", "w3", "w2"])
        } else {
            ("mlp", ["gate_proj", "up_proj", "down_proj"])
        };
        let kinds: &[&str] = if family == "gptoss" {
            &["weight", "bias"]
        } else {
            &["weight"]
        };
        for (proj, gguf) in projs
            .iter()
            .zip(["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"])
        {
            for kind in kinds {
                let mut shape = Vec::new();
                let mut data = Vec::new();
                for e in 0..moe.num_experts {
                    let t = load(&format!("{prefix}{block}.experts.{e}.{proj}.{kind}"));
                    shape = t.shape;
                    data.extend(t.data);
                }
                shape.insert(0, moe.num_experts);
                out.push(Out {
                    name: format!("blk.{layer}.{gguf}.{kind}"),
                    shape,
                    data,
                });
            }
        }
    }
    out
}

/// The `<arch>.*` keys llama.cpp's converter writes for the tiny model.
fn metadata(family: &str, c: &ModelConfig) -> BTreeMap<String, GgufValue> {
    let moe = c.moe.as_ref().unwrap();
    let arch = match family {
        "mixtral" => "llama",
        "gptoss" => "gpt-oss",
        _ => family,
    };
    let u32_ = |v: usize| GgufValue::U32(v as u32);
    let mut kv = vec![
        ("rope.freq_base", GgufValue::F32(c.rope_theta)),
        ("expert_count", u32_(moe.num_experts)),
        ("expert_used_count", u32_(moe.num_experts_per_tok)),
    ];
    if c.head_dim != c.hidden_size / c.num_attention_heads {
        kv.push(("attention.key_length", u32_(c.head_dim)));
        kv.push(("attention.value_length", u32_(c.head_dim)));
    }
    if family == "mixtral" {
        kv.push(("rope.dimension_count", u32_(c.rotary_dim)));
    }
    if family == "gptoss" {
        let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            ..
        } = c.rope_scaling
        else {
            panic!("gpt-oss without YaRN")
        };
        kv.extend([
            ("attention.sliding_window", u32_(c.sliding_window.unwrap())),
            ("rope.scaling.type", GgufValue::String("yarn".into())),
            ("rope.scaling.factor", GgufValue::F32(factor)),
            (
                "rope.scaling.original_context_length",
                u32_(original_max_position_embeddings),
            ),
            ("rope.scaling.yarn_beta_fast", GgufValue::F32(beta_fast)),
            ("rope.scaling.yarn_beta_slow", GgufValue::F32(beta_slow)),
        ]);
    }
    if matches!(family, "qwen2moe" | "qwen3moe" | "gptoss") {
        kv.push((
            "expert_feed_forward_length",
            u32_(moe.moe_intermediate_size),
        ));
    }
    if let Some(w) = moe.shared_expert_intermediate_size {
        kv.push(("expert_shared_feed_forward_length", u32_(w)));
    }
    super::family_gguf::metadata(arch, c, kv)
}

/// llama.cpp's formats for a `Q4_0` file of the tiny model: the layers' matrices and
/// experts in Q4_0, the embeddings and output in Q8_0 (Q6_K's fallback for 64-wide
/// rows), norms, biases, the router and rows that are not whole blocks (the shared expert's
/// 48-wide down projection) in f32.
fn q4_0_type(name: &str, shape: &[usize]) -> GgmlType {
    let cols = shape.last().copied().unwrap_or(0);
    // llama-quantize quantises only `.weight` tensors (gpt-oss's expert biases are 2-D).
    if shape.len() == 1
        || name.contains("ffn_gate_inp")
        || name.ends_with(".bias")
        || !cols.is_multiple_of(32)
    {
        GgmlType::F32
    } else if name.starts_with("token_embd") || name.starts_with("output") {
        GgmlType::Q8_0
    } else {
        GgmlType::Q4_0
    }
}

/// Writes the tiny model as a GGUF file, every tensor in the format `ty` picks.
fn write(family: &str, ty: &dyn Fn(&str, &[usize]) -> GgmlType) -> tempfile::TempPath {
    let c = tiny_models::config(family);
    let tensors = gguf_tensors(family, &c);
    let entries: Vec<TensorEntry> = tensors
        .iter()
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
            ty: ty(&t.name, &t.shape),
        })
        .collect();
    let path = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    write_gguf(&path, &metadata(family, &c), &entries, 32, |i| {
        let t = &tensors[i];
        Ok(match entries[i].ty {
            GgmlType::F32 => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            q => quantize_to(q, &t.data).unwrap(),
        })
    })
    .unwrap();
    if let Some(dir) = std::env::var_os("MINIVLLM_KEEP_TINY_GGUF") {
        // For scripts/check_tiny_gguf_layout.py, which compares them with the converter's.
        let kind = if entries.iter().all(|e| e.ty == GgmlType::F32) {
            "f32"
        } else {
            "q4_0"
        };
        std::fs::copy(
            &path,
            std::path::Path::new(&dir).join(format!("{family}-{kind}.gguf")),
        )
        .unwrap();
    }
    path
}

fn runner(config: &ModelConfig, model: LlamaForCausalLM) -> ModelRunner {
    let groups = KvCacheLayout::for_model(config).num_groups();
    let cache = CacheEngine::with_dtype(config, BLOCK_SIZE, 32 * groups, KvCacheDtype::Float32);
    ModelRunner::new(model, cache)
}

fn last_logits(runner: &mut ModelRunner, prompt: &[u32]) -> Vec<f32> {
    step(runner, &[(prompt, 0, prompt.len(), 0, false)])[0]
        .1
        .clone()
}

/// `config` (read from the tiny model's GGUF file) as transformers ran the reference: for
/// gpt-oss, with YaRN's ramp unrounded. llama.cpp's YaRN always rounds the ramp's bounds
/// outwards, so GGUF files load that way; gpt-oss's transformers config does not
/// (`truncate: false`).
fn as_transformers_ran_it(family: &str, mut config: ModelConfig) -> ModelConfig {
    if family != "gptoss" {
        return config;
    }
    let hf = tiny_models::config(family);
    assert_eq!(
        (config.sliding_window, &config.sliding_layers),
        (hf.sliding_window, &hf.sliding_layers)
    );
    assert_eq!(config.hidden_act, hf.hidden_act);
    assert!(config.qkv_bias && config.o_bias_and_sinks);
    let RopeScaling::Yarn { truncate, .. } = &mut config.rope_scaling else {
        panic!("gpt-oss from GGUF without YaRN: {:?}", config.rope_scaling)
    };
    assert!(*truncate, "GGUF YaRN truncates, as llama.cpp does");
    *truncate = false;
    assert_eq!(config.rope_scaling, hf.rope_scaling);
    config
}

#[test]
fn moe_families_from_gguf_files_match_transformers() {
    for family in MOE_FAMILIES {
        let path = write(family, &|_, _| GgmlType::F32);
        let file = GgufFile::open(&path).unwrap();
        let config = config_from_gguf(&file).unwrap();
        let hf = tiny_models::config(family);
        let want_family = match family {
            "qwen3moe" => ModelFamily::Qwen3Moe,
            "qwen2moe" => ModelFamily::Qwen2Moe,
            "mixtral" => ModelFamily::Mixtral,
            "gptoss" => ModelFamily::GptOss,
            _ => ModelFamily::Olmoe,
        };
        assert_eq!(config.family, want_family, "{family}");
        // The file names no dense layers (llama.cpp's qwen2moe graph has none): they are
        // the layers without a router.
        assert_eq!(config.moe, hf.moe, "{family}: experts from the file");
        let config = as_transformers_ran_it(family, config);
        let weights = GgufWeights::new(&file, &config);
        let model = LlamaForCausalLM::load(&config, &weights, &LoadOptions::FLOAT32).unwrap();
        let mut runner = runner(&config, model);
        let mut worst = 0.0f32;
        for (n, case) in cases(family).iter().enumerate() {
            let got = last_logits(&mut runner, &case.prompt);
            let what = format!("{family} from GGUF, prompt {n}");
            worst = worst.max(assert_close(&got, &case.last_logits, &what));
        }
        eprintln!("{family} from a GGUF file: worst difference from transformers {worst:.2e}");
    }
}

#[test]
fn quantised_experts_slice_into_each_experts_rows() {
    let opts = LoadOptions {
        quantization: Some(Quantization::Q4_0),
        ..LoadOptions::default()
    };
    for family in MOE_FAMILIES {
        let path = write(family, &q4_0_type);
        let file = GgufFile::open(&path).unwrap();
        let config = as_transformers_ran_it(family, config_from_gguf(&file).unwrap());
        let weights = GgufWeights::new(&file, &config);
        let from_file = LlamaForCausalLM::load(&config, &weights, &LoadOptions::default()).unwrap();
        let formats = from_file.weight_formats();
        assert!(
            formats.iter().any(|&(f, _)| f == "Q4_0"),
            "{family}: experts kept in Q4_0: {formats:?}"
        );
        let hf = tiny_models::config(family);
        let requantised = LlamaForCausalLM::load(&hf, &TinyWeights::of(family), &opts).unwrap();
        let (mut a, mut b) = (runner(&config, from_file), runner(&hf, requantised));
        for case in cases(family) {
            assert_eq!(
                last_logits(&mut a, &case.prompt),
                last_logits(&mut b, &case.prompt),
                "{family}: the Q4_0 file against the same weights quantised at load"
            );
        }
    }
}

/// llama.cpp's `MXFP4_MOE` for the tiny gpt-oss: the experts in MXFP4, the other matrices
/// in Q8_0, norms, biases, sinks and the router in f32.
fn mxfp4_moe_type(name: &str, shape: &[usize]) -> GgmlType {
    if name.contains("_exps.weight") {
        GgmlType::MXFP4
    } else if shape.len() == 2 && !name.contains("ffn_gate_inp") && !name.ends_with(".bias") {
        GgmlType::Q8_0
    } else {
        GgmlType::F32
    }
}

/// A gpt-oss file's MXFP4 experts stay MXFP4 and run on the integer kernels: its logits are
/// those of the same file computed in f32 (every weight dequantised) but for the
/// activations' rounding to 8 bits, and a wrong code table or scale would be far off.
#[test]
fn gpt_oss_mxfp4_experts_run_as_mxfp4() {
    let path = write("gptoss", &mxfp4_moe_type);
    let file = GgufFile::open(&path).unwrap();
    let config = config_from_gguf(&file).unwrap();
    let weights = GgufWeights::new(&file, &config);
    let quantised = LlamaForCausalLM::load(&config, &weights, &LoadOptions::default()).unwrap();
    let formats = quantised.weight_formats();
    assert!(formats.iter().any(|&(f, _)| f == "MXFP4"), "{formats:?}");
    let float = LlamaForCausalLM::load(&config, &weights, &LoadOptions::FLOAT32).unwrap();
    assert!(float.weight_formats().iter().all(|&(f, _)| f == "F32"));
    let (mut q, mut f) = (runner(&config, quantised), runner(&config, float));
    let mut worst = 0.0f32;
    for case in cases("gptoss") {
        let (a, b) = (
            last_logits(&mut q, &case.prompt),
            last_logits(&mut f, &case.prompt),
        );
        let d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        worst = worst.max(d);
    }
    eprintln!("gpt-oss MXFP4 experts: max |logit difference| from f32 {worst:.4}");
    assert!(worst > 0.0 && worst < 0.1, "{worst}");
}

/// `values` (rows of `cols`) as gpt-oss's checkpoints store MXFP4: `(blocks, scales)`,
/// blocks `[rows, cols / 32, 16]` with values `2k` and `2k + 1` in byte `k` (low nibble
/// first), scales `[rows, cols / 32]` E8M0: ggml's quantiser's blocks, repacked.
fn hf_mxfp4(values: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let ggml = quantize_to(GgmlType::MXFP4, values).unwrap();
    let (mut blocks, mut scales) = (Vec::new(), Vec::new());
    for b in ggml.chunks_exact(17) {
        scales.push(b[0]);
        let v = |i: usize| {
            let byte = b[1 + i % 16];
            if i < 16 {
                byte & 0x0F
            } else {
                byte >> 4
            }
        };
        blocks.extend((0..16).map(|k| v(2 * k) | (v(2 * k + 1) << 4)));
    }
    (blocks, scales)
}

/// gpt-oss's released Hugging Face checkpoints hold the experts in MXFP4 (`*_blocks`,
/// `*_scales`, output rows first, gate and up rows interleaved): such a folder runs its
/// experts in MXFP4 and gives, to the bit, the logits of a GGUF file whose experts are the
/// same MXFP4 blocks (the converter's repacking, undone as the folder is read).
#[test]
fn gpt_oss_mxfp4_folder_equals_the_gguf_file() {
    use minivllm::model_executor::model_loader::load_model;
    use safetensors::tensor::TensorView;

    let family = "gptoss";
    let hf = TinyWeights::of(family);
    let c = tiny_models::config(family);
    let moe = c.moe.as_ref().unwrap();
    let (e, width, h) = (moe.num_experts, moe.moe_intermediate_size, c.hidden_size);
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let f32_bytes = |d: &[f32]| d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for name in hf.names() {
        let t = hf.load(name).unwrap();
        let Some(base) = name
            .strip_suffix(".gate_up_proj")
            .or_else(|| name.strip_suffix(".down_proj"))
        else {
            tensors.push((
                name.into(),
                safetensors::Dtype::F32,
                t.shape,
                f32_bytes(&t.data),
            ));
            continue;
        };
        // transformers' layout `[experts, in, out]`, stored transposed: out rows first.
        let (cols, rows) = (t.shape[1], t.shape[2]);
        let mut transposed = Vec::with_capacity(t.data.len());
        for x in t.data.chunks_exact(cols * rows) {
            for r in 0..rows {
                transposed.extend((0..cols).map(|k| x[k * rows + r]));
            }
        }
        let (blocks, scales) = hf_mxfp4(&transposed);
        let proj = &name[base.len() + 1..];
        tensors.push((
            format!("{base}.{proj}_blocks"),
            safetensors::Dtype::U8,
            vec![e, rows, cols / 32, 16],
            blocks,
        ));
        tensors.push((
            format!("{base}.{proj}_scales"),
            safetensors::Dtype::U8,
            vec![e, rows, cols / 32],
            scales,
        ));
    }
    assert_eq!(
        tensors
            .iter()
            .filter(|t| t.1 == safetensors::Dtype::U8)
            .count(),
        4 * c.num_hidden_layers,
        "[{e}, {width}, {h}]"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        tiny_models::folder(family).join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, dtype, shape, bytes)| {
            (
                n.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.path().join("model.safetensors"))
        .unwrap();
    let folder = load_model(dir.path().to_str().unwrap(), &LoadOptions::default()).unwrap();
    let formats = folder.model.weight_formats();
    assert!(formats.iter().any(|&(f, _)| f == "MXFP4"), "{formats:?}");

    // The GGUF file: the same experts in MXFP4, everything else in f32.
    let experts_mxfp4 = |name: &str, _: &[usize]| {
        if name.contains("_exps.weight") {
            GgmlType::MXFP4
        } else {
            GgmlType::F32
        }
    };
    let path = write(family, &experts_mxfp4);
    let file = GgufFile::open(&path).unwrap();
    let config = as_transformers_ran_it(family, config_from_gguf(&file).unwrap());
    let weights = GgufWeights::new(&file, &config);
    let gguf = LlamaForCausalLM::load(&config, &weights, &LoadOptions::default()).unwrap();
    let (mut a, mut b) = (runner(&folder.config, folder.model), runner(&config, gguf));
    for case in cases(family) {
        assert_eq!(
            last_logits(&mut a, &case.prompt),
            last_logits(&mut b, &case.prompt),
            "the MXFP4 folder against the MXFP4 GGUF file"
        );
    }
}
