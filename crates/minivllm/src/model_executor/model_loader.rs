//! Loading a whole model (config, weights, tokenizer) from what `--model` names.

use std::path::Path;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::engine::tokenizer::{GgufTokenizerSpec, Tokenizer};
use crate::model_executor::loader::gguf::{GgufFile, GgufValue};
use crate::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use crate::model_executor::loader::hf::{resolve_model, ModelLocation};
use crate::model_executor::loader::safetensors::SafetensorsWeights;
use crate::model_executor::loader::weights::LoadOptions;
use crate::model_executor::loader::{read_json, LoadError};
use crate::model_executor::models::llama::LlamaForCausalLM;

/// A model ready to run, with the tokenizer that goes with it.
pub struct LoadedModel {
    pub location: ModelLocation,
    pub config: ModelConfig,
    pub model: LlamaForCausalLM,
    pub tokenizer: Tokenizer,
}

/// Loads a GGUF file, a Hugging Face folder, or a cached `org/name` repo id, keeping the
/// weights as `opts` say.
pub fn load_model(spec: &str, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    let location = resolve_model(spec)?;
    let start = Instant::now();
    let (config, model, tokenizer) = match &location {
        ModelLocation::Gguf(path) => load_gguf(path, opts)?,
        ModelLocation::HfDir(dir) => load_hf_dir(dir, opts)?,
    };
    let formats: Vec<String> = model
        .weight_formats()
        .iter()
        .map(|(f, bytes)| format!("{f} {:.1} MiB", *bytes as f64 / (1 << 20) as f64))
        .collect();
    tracing::info!(
        model = spec,
        layers = config.num_hidden_layers,
        hidden = config.hidden_size,
        vocab = config.vocab_size,
        weights = formats.join(", "),
        seconds = start.elapsed().as_secs_f32(),
        "model loaded"
    );
    Ok(LoadedModel {
        location,
        config,
        model,
        tokenizer,
    })
}

/// Loads only the tokenizer of what `--model` names: for clients (e.g. `bench serve`) that
/// count tokens but never run the model, so no weights are read.
pub fn load_tokenizer(spec: &str) -> Result<Tokenizer, LoadError> {
    match resolve_model(spec)? {
        ModelLocation::Gguf(path) => {
            Tokenizer::from_gguf_spec(&gguf_tokenizer_spec(&GgufFile::open(&path)?)?)
        }
        ModelLocation::HfDir(dir) => Tokenizer::from_hf_dir(&dir),
    }
}

fn load_gguf(
    path: &Path,
    opts: &LoadOptions,
) -> Result<(ModelConfig, LlamaForCausalLM, Tokenizer), LoadError> {
    let file = GgufFile::open(path)?;
    let config = config_from_gguf(&file)?;
    let model = LlamaForCausalLM::load(&config, &GgufWeights::new(&file, &config), opts)?;
    let tokenizer = Tokenizer::from_gguf_spec(&gguf_tokenizer_spec(&file)?)?;
    Ok((config, model, tokenizer))
}

fn load_hf_dir(
    dir: &Path,
    opts: &LoadOptions,
) -> Result<(ModelConfig, LlamaForCausalLM, Tokenizer), LoadError> {
    let config = ModelConfig::from_hf_json(&read_json(&dir.join("config.json"))?)?;
    let model = LlamaForCausalLM::load(&config, &SafetensorsWeights::open_dir(dir)?, opts)?;
    let tokenizer = Tokenizer::from_hf_dir(dir)?;
    Ok((config, model, tokenizer))
}

/// Collects the `tokenizer.ggml.*` metadata the tokenizer is rebuilt from.
pub fn gguf_tokenizer_spec(file: &GgufFile) -> Result<GgufTokenizerSpec, LoadError> {
    let get = |k: &str| file.get(&format!("tokenizer.ggml.{k}"));
    let strings = |k: &str| -> Vec<String> {
        get(k)
            .and_then(GgufValue::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let id = |k: &str| get(k).and_then(GgufValue::as_u64).map(|v| v as u32);
    let flag = |k: &str| get(k).and_then(GgufValue::as_bool);
    let model = get("model")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| LoadError::Tokenizer("GGUF lacks tokenizer.ggml.model".into()))?
        .to_string();
    Ok(GgufTokenizerSpec {
        model,
        pre: get("pre").and_then(GgufValue::as_str).map(String::from),
        tokens: strings("tokens"),
        token_types: get("token_type")
            .and_then(GgufValue::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_u64().map(|x| x as i32))
                    .collect()
            })
            .unwrap_or_default(),
        scores: get("scores")
            .and_then(GgufValue::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_f64().map(|x| x as f32))
                    .collect()
            })
            .unwrap_or_default(),
        merges: strings("merges"),
        bos_token_id: id("bos_token_id"),
        eos_token_id: id("eos_token_id"),
        unk_token_id: id("unknown_token_id"),
        pad_token_id: id("padding_token_id"),
        eot_token_id: id("eot_token_id"),
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        add_space_prefix: flag("add_space_prefix"),
        chat_template: file
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(String::from),
    })
}
