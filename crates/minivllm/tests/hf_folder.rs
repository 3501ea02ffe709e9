//! The same weights loaded from a Hugging Face folder (safetensors + config.json) and from the
//! GGUF file give the same logits.

mod common;

use std::collections::BTreeMap;

use minivllm::model_executor::input_metadata::InputMetadata;
use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm::model_executor::loader::gguf_weights::{config_from_gguf, hf_name, GgufWeights};
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::model_executor::loader::weights::WeightSource;
use minivllm::model_executor::model_loader::load_model;
use minivllm::worker::cache_engine::CacheEngine;
use minivllm::worker::model_runner::ModelRunner;
use safetensors::tensor::TensorView;

/// Writes the GGUF's weights, dequantised and under Hugging Face names, as `model.safetensors`
/// next to the reference folder's config and tokenizer files.
fn write_hf_folder(dir: &std::path::Path) {
    let gguf = GgufFile::open(&common::test_model_path()).unwrap();
    let config = config_from_gguf(&gguf).unwrap();
    let weights = GgufWeights::new(&gguf, &config);
    let mut tensors = BTreeMap::new();
    for t in &gguf.tensors {
        let name = hf_name(&t.name).expect("llama tensor");
        let tensor = weights.load(&name).unwrap();
        let bytes: Vec<u8> = tensor.data.iter().flat_map(|f| f.to_le_bytes()).collect();
        tensors.insert(name, (tensor.shape, bytes));
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, (shape, bytes))| {
            (
                n.clone(),
                TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes).unwrap(),
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

fn logits_for(spec: &str, tokens: &[u32]) -> Vec<f32> {
    // f32 on both sides: the GGUF's blocks would otherwise stay quantised.
    let m = load_model(spec, &LoadOptions::FLOAT32).unwrap();
    let mut runner = ModelRunner::new(m.model, CacheEngine::new(&m.config, 16, 8));
    let mut input = InputMetadata::default();
    input.add_sequence(tokens, tokens.len(), &[0, 1, 2], 16, false);
    input.logits_indices.extend(0..tokens.len());
    runner.execute(&input).unwrap().to_vec()
}

#[test]
fn hf_folder_and_gguf_give_the_same_logits() {
    minivllm::kernels::threading::init_threads(2);
    let dir = tempfile::tempdir().unwrap();
    write_hf_folder(dir.path());
    let tokens = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198];
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
    let a = load_model(dir.path().to_str().unwrap(), &LoadOptions::FLOAT32)
        .unwrap()
        .tokenizer;
    let ids = a.encode("The capital of France is", true).unwrap();
    assert_eq!(ids, [504, 3575, 282, 4649, 314]);
}
