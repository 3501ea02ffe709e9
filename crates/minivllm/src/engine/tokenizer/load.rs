//! Finding and building the tokenizer of what `--model` names: a GGUF file's
//! `tokenizer.ggml.*` metadata, or a Hugging Face folder's `tokenizer.json`.

use std::collections::BTreeMap;

use crate::engine::tokenizer::{GgufTokenizerSpec, Tokenizer};
use crate::model_executor::loader::gguf::{GgufFile, GgufValue};
use crate::model_executor::loader::hf::{resolve_model, ModelLocation};
use crate::model_executor::loader::LoadError;
use crate::model_executor::model_loader::LoadedModel;

/// Loads the tokenizer of what `--model` names, reading no weights (clients such as
/// `bench serve` count tokens without running the model).
pub fn load_tokenizer(spec: &str) -> Result<Tokenizer, LoadError> {
    Tokenizer::load(&resolve_model(spec)?)
}

impl Tokenizer {
    /// The tokenizer of a model already located (as [`crate::model_executor::model_loader`]
    /// located its weights).
    pub fn load(location: &ModelLocation) -> Result<Tokenizer, LoadError> {
        match location {
            ModelLocation::Gguf(path) => {
                Tokenizer::from_gguf_spec(&take_tokenizer_spec(GgufFile::open(path)?.metadata)?)
            }
            ModelLocation::HfDir(dir) => Tokenizer::from_hf_dir(dir),
        }
    }

    /// The tokenizer of a model already loaded.
    pub fn for_model(model: &LoadedModel) -> Result<Tokenizer, LoadError> {
        Tokenizer::load(&model.location)
    }
}

/// [`gguf_tokenizer_spec`] from metadata it consumes: the long arrays are moved, not copied,
/// and the rest is freed before the tokenizer is built (a 262k-token vocabulary's metadata
/// is tens of MiB).
fn take_tokenizer_spec(
    mut metadata: BTreeMap<String, GgufValue>,
) -> Result<GgufTokenizerSpec, LoadError> {
    let mut take = |k: &str| match metadata.remove(&format!("tokenizer.ggml.{k}")) {
        Some(GgufValue::Array(values)) => values,
        Some(other) => {
            // Not an array: left for the checks of `gguf_tokenizer_spec` to name.
            metadata.insert(format!("tokenizer.ggml.{k}"), other);
            Vec::new()
        }
        None => Vec::new(),
    };
    let strings = |values: Vec<GgufValue>| -> Vec<String> {
        values
            .into_iter()
            .filter_map(|v| match v {
                GgufValue::String(s) => Some(s),
                _ => None,
            })
            .collect()
    };
    let tokens = strings(take("tokens"));
    let merges = strings(take("merges"));
    let mut spec = gguf_tokenizer_spec(&metadata)?;
    spec.tokens = tokens;
    spec.merges = merges;
    Ok(spec)
}

/// Collects the `tokenizer.ggml.*` metadata the tokenizer is rebuilt from.
pub fn gguf_tokenizer_spec(
    metadata: &BTreeMap<String, GgufValue>,
) -> Result<GgufTokenizerSpec, LoadError> {
    let get = |k: &str| metadata.get(&format!("tokenizer.ggml.{k}"));
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
        chat_template: metadata
            .get("tokenizer.chat_template")
            .and_then(GgufValue::as_str)
            .map(String::from),
    })
}
