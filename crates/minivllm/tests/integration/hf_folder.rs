//! The same weights loaded from a Hugging Face folder (safetensors + config.json) and from the
//! GGUF file give the same logits.

use crate::common;

use std::collections::BTreeMap;

use minivllm::ids::BlockId;
use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, hf_name, GgufWeights};
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::model_executor::loader::weights::WeightSource;
use minivllm::model_executor::model_loader::load_model;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::{ModelRunner, SeqInput};
use safetensors::tensor::TensorView;

/// Writes the GGUF's weights, dequantised and under Hugging Face names, as `model.safetensors`
/// (f32, or rounded to bf16 with `bf16`) next to the reference folder's config and tokenizer
/// files.
fn write_hf_folder(dir: &std::path::Path, bf16: bool) {
    let gguf = GgufFile::open(&common::test_model_path()).unwrap();
    let config = config_from_gguf(&gguf).unwrap();
    let weights = GgufWeights::new(&gguf, &config);
    let mut tensors = BTreeMap::new();
    for t in &gguf.tensors {
        let name = hf_name(&t.name, minivllm::config::ModelFamily::Llama).expect("llama tensor");
        let tensor = weights.load(&name).unwrap();
        let bytes: Vec<u8> = if bf16 {
            let b = tensor.data.iter().map(|&f| half::bf16::from_f32(f));
            b.flat_map(|b| b.to_le_bytes()).collect()
        } else {
            tensor.data.iter().flat_map(|f| f.to_le_bytes()).collect()
        };
        tensors.insert(name, (tensor.shape, bytes));
    }
    let dtype = if bf16 {
        safetensors::Dtype::BF16
    } else {
        safetensors::Dtype::F32
    };
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (shape, bytes))| {
            (
                n.clone(),
                TensorView::new(dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    let src = common::reference_dir().join("smollm2-hf");
    for f in [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
}

const TOKENS: [u32; 9] = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198];

fn logits_for(spec: &str, tokens: &[u32]) -> Vec<f32> {
    // f32 on both sides: the GGUF's blocks would otherwise stay quantised.
    logits_with(spec, tokens, &LoadOptions::FLOAT32)
}

fn logits_with(spec: &str, tokens: &[u32], opts: &LoadOptions) -> Vec<f32> {
    let m = load_model(spec, opts).unwrap();
    let mut runner = ModelRunner::new(m.model, CacheEngine::new(&m.config, 16, 8));
    // Prompt logprobs from position 0 ask for every position's logits: the prompt rows,
    // then the last position's as the row to sample.
    let seq = SeqInput {
        token_ids: tokens,
        prompt_len: tokens.len(),
        num_computed: 0,
        num_new: tokens.len(),
        block_tables: &[vec![BlockId(0), BlockId(1), BlockId(2)]],
        prompt_logprobs_from: Some(0),
        state: None,
    };
    runner.prepare_input([seq], &mut Vec::new());
    runner.execute_model().unwrap().to_vec()
}

#[test]
fn hf_folder_and_gguf_give_the_same_logits() {
    minivllm::kernels::threading::init_threads(2);
    let dir = tempfile::tempdir().unwrap();
    write_hf_folder(dir.path(), false);
    let tokens = TOKENS;
    let from_gguf = logits_for(common::test_model_path().to_str().unwrap(), &tokens);
    let from_hf = logits_for(dir.path().to_str().unwrap(), &tokens);
    assert_eq!(from_gguf.len(), from_hf.len());
    let worst = from_gguf
        .iter()
        .zip(&from_hf)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= 1e-5, "max |logit difference| {worst:e}");
    // Same tokenizer behaviour from both sources.
    let a = minivllm::engine::tokenizer::load_tokenizer(dir.path().to_str().unwrap()).unwrap();
    let ids = a.encode("The capital of France is", true).unwrap();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
}

fn worst_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// A bf16 checkpoint stays bf16 in memory (`--dtype auto`), and computes what the same
/// weights widened to f32 compute (widening is exact; the product is the f32 one).
#[test]
fn bf16_checkpoint_is_kept_in_bf16() {
    minivllm::kernels::threading::init_threads(2);
    let dir = tempfile::tempdir().unwrap();
    write_hf_folder(dir.path(), true);
    let spec = dir.path().to_str().unwrap();
    let m = load_model(spec, &LoadOptions::default()).unwrap();
    let formats = m.model.weight_formats();
    assert_eq!(formats.iter().map(|f| f.0).collect::<Vec<_>>(), ["BF16"]);
    let kept = logits_with(spec, &TOKENS, &LoadOptions::default());
    let widened = logits_for(spec, &TOKENS);
    let worst = worst_difference(&kept, &widened);
    assert!(
        worst <= 1e-4,
        "bf16 kept vs widened: max |logit difference| {worst:e}"
    );
}

/// `--dtype float16` / `bfloat16` round f32 weights to half precision at load: logits move by
/// that rounding only (measured: f16 0.031, bf16 0.156 at most, in logits of magnitude ~20).
#[test]
fn float_weights_round_to_the_asked_half_precision() {
    use minivllm::model_executor::loader::weights::DType;
    minivllm::kernels::threading::init_threads(2);
    let dir = tempfile::tempdir().unwrap();
    write_hf_folder(dir.path(), false);
    let spec = dir.path().to_str().unwrap();
    let f32_logits = logits_for(spec, &TOKENS);
    for (dtype, format, bound) in [(DType::Float16, "F16", 0.1), (DType::BFloat16, "BF16", 1.0)] {
        let opts = LoadOptions {
            dtype,
            quantization: None,
        };
        let m = load_model(spec, &opts).unwrap();
        assert_eq!(m.model.weight_formats()[0].0, format);
        let worst = worst_difference(&logits_with(spec, &TOKENS, &opts), &f32_logits);
        eprintln!("{format} weights: max |logit difference| from f32 {worst:.4}");
        assert!(worst < bound, "{format}: max |logit difference| {worst}");
        assert!(worst > 0.0, "{format}: rounding should show");
    }
}

/// The Mixture-of-Experts tiny models as Hugging Face folders (their `config.json` and a
/// `model.safetensors` of the hub's per-expert tensors, Mixtral's under
/// `block_sparse_moe.experts.E.w1/w2/w3`, gpt-oss's stacked `mlp.experts.gate_up_proj`
/// read an expert's slice at a time) load through `load_model` and give transformers'
/// logits.
#[test]
fn moe_folders_give_transformers_logits() {
    use super::tiny_models;

    minivllm::kernels::threading::init_threads(2);
    for family in [
        "qwen3moe",
        "qwen2moe",
        "mixtral",
        "olmoe",
        "gptoss",
        "gemma4moe",
    ] {
        let dir = tempfile::tempdir().unwrap();
        tiny_models::write_hf_folder(family, dir.path());
        gives_transformers_logits(family, dir.path());
    }
}

/// The folder at `dir`, loaded by `load_model`, gives `family`'s reference last logits.
fn gives_transformers_logits(family: &str, dir: &std::path::Path) {
    use super::model_families::{assert_close, cases, step};

    let m = load_model(dir.to_str().unwrap(), &LoadOptions::FLOAT32)
        .unwrap_or_else(|e| panic!("{family}: {e}"));
    let cache = CacheEngine::new(&m.config, 16, 32).with_state_slots(&m.config, 1);
    let mut runner = ModelRunner::new(m.model, cache);
    for (n, case) in cases(family).iter().enumerate() {
        let got = step(
            &mut runner,
            &[(&case.prompt, 0, case.prompt.len(), 0, false)],
        );
        assert_close(
            &got[0].1,
            &case.last_logits,
            &format!("{family} folder, prompt {n}"),
        );
    }
}

/// A multimodal checkpoint (transformers 5's `Qwen3_5ForConditionalGeneration` and Gemma 4's
/// `Gemma4ForConditionalGeneration`, as E2B ships: the text model's config under
/// `text_config`, its tensors under `model.language_model.`, a vision tower beside them)
/// loads its text model, which gives transformers' logits.
#[test]
fn a_multimodal_folder_loads_its_text_model() {
    use super::tiny_models;

    minivllm::kernels::threading::init_threads(2);
    for (family, arch, model_type) in [
        ("qwen35", "Qwen3_5ForConditionalGeneration", "qwen3_5"),
        ("gemma4e", "Gemma4ForConditionalGeneration", "gemma4"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let text: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(tiny_models::folder(family).join("config.json")).unwrap(),
        )
        .unwrap();
        let tie = text["tie_word_embeddings"].clone();
        let config = serde_json::json!({
            "architectures": [arch],
            "model_type": model_type,
            "text_config": text,
            "vision_config": {"depth": 1, "hidden_size": 32, "model_type": model_type},
            "tie_word_embeddings": tie,
        });
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let rename = |name: &str| match name.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => name.to_string(),
        };
        let vision = [(
            "model.visual.patch_embed.proj.weight",
            vec![32, 3, 2, 16, 16],
        )];
        tiny_models::write_safetensors(family, dir.path(), rename, &vision);
        gives_transformers_logits(family, dir.path());
    }
}
