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
            "intermediate_size 1099511627776 is above the largest supported (16777216)",
        ),
        (
            "llama.feed_forward_length",
            GgufValue::U32(1 << 20),
            "intermediate_size 1048576 does not match the tensor \
             model.layers.0.mlp.gate_proj.weight [1536, 576]",
        ),
        (
            "llama.embedding_length",
            huge.clone(),
            "hidden_size 1099511627776 is above the largest supported",
        ),
        (
            "llama.embedding_length",
            GgufValue::U32(4608),
            "hidden_size 4608 does not match the tensor model.embed_tokens.weight [49152, 576]",
        ),
        (
            "llama.block_count",
            huge.clone(),
            "num_hidden_layers 1099511627776 is above the largest supported",
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
            "vocab_size 1099511627776 is above the largest supported",
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

/// The tensors of a tiny LLaMA (vocabulary 16, width 8, one layer of 2 heads of 4 sharing one
/// KV head, MLP 16), in f32, and the `config.json` that describes them.
fn tiny_tensors() -> Vec<(String, Vec<usize>)> {
    let layer = |s: &str| format!("model.layers.0.{s}.weight");
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![16, 8]),
        ("model.norm.weight".to_string(), vec![8]),
    ];
    for (name, shape) in [
        ("input_layernorm", vec![8]),
        ("post_attention_layernorm", vec![8]),
        ("self_attn.q_proj", vec![8, 8]),
        ("self_attn.k_proj", vec![4, 8]),
        ("self_attn.v_proj", vec![4, 8]),
        ("self_attn.o_proj", vec![8, 8]),
        ("mlp.gate_proj", vec![16, 8]),
        ("mlp.up_proj", vec![16, 8]),
        ("mlp.down_proj", vec![8, 16]),
    ] {
        t.push((layer(name), shape));
    }
    t
}

fn tiny_config() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "vocab_size": 16, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
        "tie_word_embeddings": true
    })
}

/// Writes `tensors` (f32, small values) as the safetensors file `path`.
fn write_safetensors(path: &std::path::Path, tensors: &[(String, Vec<usize>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| {
            let n: usize = shape.iter().product();
            (0..n)
                .flat_map(|i| (0.01 * i as f32).to_le_bytes())
                .collect()
        })
        .collect();
    let views = tensors.iter().zip(&bytes).map(|((name, shape), b)| {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b);
        (name.clone(), view.unwrap())
    });
    safetensors::tensor::serialize_to_file(views, None, path).unwrap();
}

/// A folder holding the tiny model's weights and `config`.
fn tiny_hf_folder(config: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &tiny_tensors());
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// Why loading the model in `dir` fails (the folder has no tokenizer: the model must fail
/// first).
fn model_err(dir: &std::path::Path) -> String {
    match load_model(dir.to_str().unwrap(), &LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// `config.json` sizes too large to be real, or that the weights contradict, are refused
/// naming the field, before any buffer is sized by them (before, `hidden_size` 2^62 panicked
/// on a capacity overflow and 2^40 aborted allocating the embeddings).
#[test]
fn absurd_or_contradictory_config_json_sizes_are_refused() {
    let ok = tiny_hf_folder(&tiny_config());
    load_model(ok.path().to_str().unwrap(), &LoadOptions::default()).unwrap();
    let huge = serde_json::json!(1u64 << 40);
    let cases: Vec<(Vec<(&str, serde_json::Value)>, &str)> = vec![
        (
            vec![("hidden_size", serde_json::json!(1u64 << 62))],
            "hidden_size 4611686018427387904 is above the largest supported (16777216)",
        ),
        (
            vec![
                ("hidden_size", huge.clone()),
                ("head_dim", serde_json::json!(1u64 << 32)),
            ],
            "hidden_size 1099511627776 is above the largest supported",
        ),
        (
            vec![("head_dim", serde_json::json!(1u64 << 32))],
            "head_dim 4294967296 is above the largest supported (4096)",
        ),
        (
            vec![("intermediate_size", huge.clone())],
            "intermediate_size 1099511627776 is above",
        ),
        (
            vec![("num_attention_heads", huge.clone())],
            "num_attention_heads 1099511627776 is above",
        ),
        (
            vec![("num_attention_heads", serde_json::json!(1u64 << 23))],
            "num_attention_heads × head_dim (8388608 × 4) is above",
        ),
        (
            vec![("vocab_size", huge.clone())],
            "vocab_size 1099511627776 is above",
        ),
        (
            vec![("num_hidden_layers", huge.clone())],
            "num_hidden_layers 1099511627776 is above",
        ),
        (
            vec![("hidden_size", serde_json::json!(4096))],
            "hidden_size 4096 does not match the tensor model.embed_tokens.weight [16, 8]",
        ),
        (
            vec![("vocab_size", serde_json::json!(1 << 20))],
            "vocab_size 1048576 does not match the tensor model.embed_tokens.weight [16, 8]",
        ),
        (
            vec![("intermediate_size", serde_json::json!(1 << 20))],
            "intermediate_size 1048576 does not match the tensor \
             model.layers.0.mlp.gate_proj.weight [16, 8]",
        ),
        (
            vec![("num_attention_heads", serde_json::json!(1024))],
            "num_attention_heads × head_dim 4096 does not match the tensor \
             model.layers.0.self_attn.q_proj.weight [8, 8]",
        ),
        (
            vec![("num_key_value_heads", serde_json::json!(2))],
            "num_key_value_heads × head_dim 8 does not match the tensor \
             model.layers.0.self_attn.k_proj.weight [4, 8]",
        ),
        (
            vec![("num_hidden_layers", serde_json::json!(1000))],
            "num_hidden_layers 1000 but the weights hold no model.layers.999",
        ),
    ];
    for (edits, needle) in cases {
        let mut config = tiny_config();
        for (key, value) in &edits {
            config[key] = value.clone();
        }
        let dir = tiny_hf_folder(&config);
        let e = model_err(dir.path());
        assert!(
            e.contains(needle) && e.contains("config.json: "),
            "{edits:?}: {e}"
        );
    }
}

/// A folder whose index maps the tiny model's tensors to `shard` (the embeddings) and to a
/// real shard in the folder (the rest).
fn indexed_folder(shard: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let tensors = tiny_tensors();
    write_safetensors(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &tensors[1..],
    );
    let mut map = serde_json::Map::new();
    for (name, _) in &tensors[1..] {
        map.insert(name.clone(), "model-00001-of-00002.safetensors".into());
    }
    map.insert(tensors[0].0.clone(), shard.into());
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("config.json"), tiny_config().to_string()).unwrap();
    dir
}

/// Like [`model_err`], failing rather than hanging if loading blocks (on a FIFO).
fn model_err_in_time(dir: &std::path::Path) -> String {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(model_err(&dir)));
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("loading did not finish within 60 s")
}

/// The shards an index names stay in the model's folder and are regular files: `..`, an
/// absolute path, a FIFO (which blocked the load for ever) and a folder are refused, named.
#[test]
fn index_shards_outside_the_folder_or_not_regular_files_are_refused() {
    let outside = tempfile::tempdir().unwrap();
    let good = indexed_folder("model-00002-of-00002.safetensors");
    write_safetensors(
        &good.path().join("model-00002-of-00002.safetensors"),
        &tiny_tensors()[..1],
    );
    load_model(good.path().to_str().unwrap(), &LoadOptions::default()).unwrap();

    let inner = outside.path().join("model");
    std::fs::create_dir(&inner).unwrap();
    let stray = outside.path().join("outside.safetensors");
    write_safetensors(&stray, &tiny_tensors()[..1]);
    let absolute = stray.to_str().unwrap().to_string();
    for shard in [
        "../outside.safetensors",
        absolute.as_str(),
        "sub/../../outside.safetensors",
        "./x.safetensors",
        "",
    ] {
        let dir = indexed_folder(shard);
        let e = model_err_in_time(dir.path());
        assert!(
            e.contains(&format!(
                "shard {shard:?} is not a file name in the model's folder"
            )),
            "{shard}: {e}"
        );
    }

    let fifo = indexed_folder("fifo.safetensors");
    let made = std::process::Command::new("mkfifo")
        .arg(fifo.path().join("fifo.safetensors"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let folder = indexed_folder("sub.safetensors");
    std::fs::create_dir(folder.path().join("sub.safetensors")).unwrap();
    for (dir, name) in [(&fifo, "fifo.safetensors"), (&folder, "sub.safetensors")] {
        let e = model_err_in_time(dir.path());
        assert!(
            e.contains(name) && e.contains("must be a regular file"),
            "{name}: {e}"
        );
    }
}
