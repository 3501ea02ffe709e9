//! Bad input gives an error that names the problem, never a panic.

use crate::common;

use std::io::Write;

use minivllm::engine::llm_engine::{EngineArgs, EngineError, LLMEngine, PromptInput};
use minivllm::model_executor::loader::gguf::{GgufFile, GgufValue};
use minivllm::model_executor::loader::gguf_writer::{write_gguf, TensorEntry};
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::model_executor::model_loader::load_model;
use minivllm::sampling_params::SamplingParams;

/// Why loading `spec` as the engine does (the model, then its tokenizer) fails.
fn load_err(spec: &str) -> String {
    let loaded = load_model(spec, &LoadOptions::default())
        .and_then(|_| minivllm::engine::tokenizer::load_tokenizer(spec));
    match loaded {
        Ok(_) => panic!("{spec} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_file_is_named() {
    let e = load_err("/definitely/not/here.gguf");
    assert!(
        e.contains("/definitely/not/here.gguf") && e.contains("does not exist"),
        "{e}"
    );
}

#[test]
fn wrong_magic_is_reported() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(b"GGML\x03\x00\x00\x00 certainly not a gguf file")
        .unwrap();
    let e = load_err(f.path().to_str().unwrap());
    assert!(e.contains("not a GGUF file"), "{e}");
}

#[test]
fn truncated_gguf_is_reported() {
    let full = std::fs::read(common::test_model_path()).unwrap();
    for cut in [6, 100, 4 << 20, full.len() - 1] {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&full[..cut]).unwrap();
        let e = load_err(f.path().to_str().unwrap());
        assert!(
            e.contains("malformed GGUF") || e.contains("truncated"),
            "cut at {cut}: {e}"
        );
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = common::reference_dir().join("smollm2-hf/config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["GPTNeoXForCausalLM"]);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let e = load_err(dir.path().to_str().unwrap());
    assert!(
        e.contains("unsupported model architecture") && e.contains("GPTNeoXForCausalLM"),
        "{e}"
    );
}

/// An engine on the test model with a small context (32 tokens) and a cache that holds
/// `kv_tokens` tokens.
fn small_engine(kv_tokens: u64) -> Result<LLMEngine, EngineError> {
    LLMEngine::from_engine_args(&EngineArgs {
        model: common::test_model_path().display().to_string(),
        max_model_len: Some(32),
        // SmolLM2 keeps 30 layers × 2 × 3 KV heads × 64 values per position, in f16.
        kv_cache_memory: kv_tokens * 30 * 2 * 3 * 64 * 2,
        threads: Some(2),
        ..EngineArgs::default()
    })
}

#[test]
fn prompt_longer_than_the_context_is_rejected() {
    let mut engine = small_engine(256).unwrap();
    let e = engine
        .add_request(
            "a",
            PromptInput::from(vec![5; 40]),
            SamplingParams::default(),
            0,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(length 40)") && e.contains("maximum model length of 32"),
        "{e}"
    );
    // The engine goes on serving.
    engine
        .add_request(
            "b",
            PromptInput::from(vec![1, 2, 3]),
            SamplingParams::default(),
            0,
        )
        .unwrap();
}

#[test]
fn a_cache_smaller_than_the_context_is_refused_at_start() {
    let e = small_engine(16)
        .err()
        .expect("a 16-token cache")
        .to_string();
    assert!(
        e.contains("fewer than max_model_len 32") && e.contains("--kv-cache-memory"),
        "{e}"
    );
}

#[test]
fn token_ids_outside_the_vocabulary_are_rejected() {
    let mut engine = small_engine(256).unwrap();
    let e = engine
        .add_request(
            "a",
            PromptInput::from(vec![1, 999_999]),
            SamplingParams::default(),
            0,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("999999") && e.contains("vocabulary"), "{e}");
}

/// The test model rewritten with metadata `key` set to `value`.
fn mutated_gguf(key: &str, value: GgufValue) -> tempfile::TempPath {
    let src = GgufFile::open(&common::test_model_path()).unwrap();
    let mut metadata = src.metadata.clone();
    metadata.insert(key.to_string(), value);
    let tensors: Vec<TensorEntry> = src.tensors.iter().map(TensorEntry::from).collect();
    let path = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    write_gguf(&path, &metadata, &tensors, src.alignment, |i| {
        let bytes = src
            .tensor(&tensors[i].name)
            .map(|t| src.tensor_bytes(t).to_vec());
        Ok(bytes.unwrap_or_default())
    })
    .unwrap();
    path
}

/// Metadata that would size allocations, or that contradicts the file, is refused with an
/// error naming it, before anything is allocated from it.
#[test]
fn absurd_or_contradictory_model_numbers_are_refused() {
    let huge = GgufValue::U64(1 << 40);
    for (key, value, needle) in [
        (
            "llama.feed_forward_length",
            huge.clone(),
            "expected [1099511627776, 576]",
        ),
        (
            "llama.embedding_length",
            huge.clone(),
            "head_dim (122167958641)",
        ),
        (
            "llama.block_count",
            huge.clone(),
            "missing tensor model.layers.30",
        ),
        (
            "llama.block_count",
            GgufValue::U32(29),
            "block_count is 29 but the file holds 30",
        ),
        (
            "llama.attention.head_count",
            huge.clone(),
            "head_dim must be positive",
        ),
        (
            "llama.attention.head_count_kv",
            GgufValue::U32(1 << 30),
            "num_key_value_heads",
        ),
        (
            "llama.vocab_size",
            huge.clone(),
            "expected [1099511627776, 576]",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            GgufValue::U32(1 << 30),
            "eos_token_id 1073741824",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            GgufValue::U32(49152),
            "bos_token_id 49152",
        ),
    ] {
        let path = mutated_gguf(key, value);
        let e = load_err(path.to_str().unwrap());
        assert!(e.contains(needle), "{key}: {e}");
    }
}
