//! Loading a model (config and weights) from what `--model` names. Its tokenizer is the
//! engine's to load (`engine::tokenizer::load_tokenizer`): the model runs on token ids.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::config::{ConfigError, ModelConfig};
use crate::distributed::{Communicator, SingleProcess};
use crate::model_executor::loader::gguf::GgufFile;
use crate::model_executor::loader::gguf_weights::{config_from_gguf, GgufWeights};
use crate::model_executor::loader::hf::{resolve_model, ModelLocation};
use crate::model_executor::loader::safetensors::SafetensorsWeights;
use crate::model_executor::loader::weights::LoadOptions;
use crate::model_executor::loader::{read_json, LoadError};
use crate::model_executor::models::llama::{check_config_against_weights, LlamaForCausalLM};

/// A model ready to run.
pub struct LoadedModel {
    pub location: ModelLocation,
    pub config: ModelConfig,
    pub model: LlamaForCausalLM,
}

/// Loads a GGUF file, a Hugging Face folder, or a cached `org/name` repo id, keeping the
/// weights as `opts` say.
pub fn load_model(spec: &str, opts: &LoadOptions) -> Result<LoadedModel, LoadError> {
    load_model_shard(spec, opts, Arc::new(SingleProcess))
}

/// Loads this rank's shard of the model for a tensor-parallel group (`comm`): only its part
/// of each split weight is kept.
pub(crate) fn load_model_shard(
    spec: &str,
    opts: &LoadOptions,
    comm: Arc<dyn Communicator>,
) -> Result<LoadedModel, LoadError> {
    let location = resolve_model(spec)?;
    let start = Instant::now();
    let (config, model) = match &location {
        ModelLocation::Gguf(path) => load_gguf(path, opts, comm)?,
        ModelLocation::HfDir(dir) => load_hf_dir(dir, opts, comm)?,
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
    })
}

fn load_gguf(
    path: &Path,
    opts: &LoadOptions,
    comm: Arc<dyn Communicator>,
) -> Result<(ModelConfig, LlamaForCausalLM), LoadError> {
    let mut file = GgufFile::open(path)?;
    let config = config_from_gguf(&file)?;
    // The metadata has given the config; the vocabulary it holds (tens of MiB for a
    // 262k-token one) is not kept while the weights load.
    drop(std::mem::take(&mut file.metadata));
    let weights = GgufWeights::new(&file, &config);
    check_config_against_weights(&config, &weights, &path.display().to_string())?;
    let model = LlamaForCausalLM::load_parallel(&config, &weights, opts, comm)?;
    Ok((config, model))
}

fn load_hf_dir(
    dir: &Path,
    opts: &LoadOptions,
    comm: Arc<dyn Communicator>,
) -> Result<(ModelConfig, LlamaForCausalLM), LoadError> {
    let path = dir.join("config.json");
    let config = ModelConfig::from_hf_json(&read_json(&path)?).map_err(|e| match e {
        ConfigError::Invalid(m) => LoadError::Config(format!("{}: {m}", path.display())),
        other => other.into(),
    })?;
    let weights = SafetensorsWeights::open_dir(dir)?;
    check_config_against_weights(&config, &weights, &path.display().to_string())?;
    let model = LlamaForCausalLM::load_parallel(&config, &weights, opts, comm)?;
    Ok((config, model))
}
