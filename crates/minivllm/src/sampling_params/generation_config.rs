//! A Hugging Face folder's `generation_config.json` as default sampling parameters (vLLM's
//! `--generation-config auto`): the model's own temperature, top-p, top-k, min-p,
//! repetition penalty and `max_new_tokens`, for requests that do not set them.

use std::path::Path;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::SamplingParams;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
struct Fields {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    max_new_tokens: Option<usize>,
}

/// Default sampling parameters, and the `max_tokens` for requests that leave it open.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationDefaults {
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    /// The fields that came from the file, to log.
    pub from_file: Vec<&'static str>,
}

impl GenerationDefaults {
    /// From `dir/generation_config.json` when `dir` is a folder that has one (a GGUF file
    /// has none: vLLM's defaults then). A file that does not parse is an error naming it.
    pub fn from_model(dir: &Path) -> Result<Self, String> {
        let path = dir.join("generation_config.json");
        if !dir.is_dir() || !path.is_file() {
            return Ok(Self::default());
        }
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let f: Fields =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut d = Self::default();
        let p = &mut d.params;
        let mut set = |name: &'static str, present: bool| {
            if present {
                d.from_file.push(name);
            }
        };
        set("temperature", f.temperature.is_some());
        set("top_p", f.top_p.is_some());
        set("top_k", f.top_k.is_some());
        set("min_p", f.min_p.is_some());
        set("repetition_penalty", f.repetition_penalty.is_some());
        set("max_new_tokens", f.max_new_tokens.is_some());
        p.temperature = f.temperature.unwrap_or(p.temperature);
        p.top_p = f.top_p.unwrap_or(p.top_p);
        p.top_k = f.top_k.unwrap_or(p.top_k);
        p.min_p = f.min_p.unwrap_or(p.min_p);
        p.repetition_penalty = f.repetition_penalty.unwrap_or(p.repetition_penalty);
        d.max_tokens = f.max_new_tokens;
        Ok(d)
    }

    /// The values the file set, under `SamplingParams`' names (`max_new_tokens` as
    /// `max_tokens`): for callers that build their own parameters from them (Python's
    /// `LLM.get_default_sampling_params`), so the file is read here alone.
    pub fn from_file_json(&self) -> Map<String, Value> {
        // An f32 as the file wrote it (its shortest decimal), not its binary widening
        // (0.6 rather than 0.6000000238418579).
        let decimal = |x: f32| json!(x.to_string().parse::<f64>().unwrap_or(f64::from(x)));
        let p = &self.params;
        let mut m = Map::new();
        for &name in &self.from_file {
            let (key, value) = match name {
                "temperature" => (name, decimal(p.temperature)),
                "top_p" => (name, decimal(p.top_p)),
                "top_k" => (name, json!(p.top_k)),
                "min_p" => (name, decimal(p.min_p)),
                "repetition_penalty" => (name, decimal(p.repetition_penalty)),
                "max_new_tokens" => ("max_tokens", json!(self.max_tokens)),
                _ => continue,
            };
            m.insert(key.into(), value);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folders_file_sets_the_defaults() {
        let dir = std::env::temp_dir().join(format!("gencfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let none = GenerationDefaults::from_model(&dir).unwrap();
        assert_eq!(none, GenerationDefaults::default());
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 64, "bos_token_id": 1}"#,
        )
        .unwrap();
        let d = GenerationDefaults::from_model(&dir).unwrap();
        assert_eq!(
            (d.params.temperature, d.params.top_p, d.max_tokens),
            (0.2, 0.9, Some(64))
        );
        assert_eq!(d.params.top_k, SamplingParams::default().top_k);
        assert_eq!(d.from_file, ["temperature", "top_p", "max_new_tokens"]);
        assert_eq!(
            Value::Object(d.from_file_json()),
            json!({"temperature": 0.2, "top_p": 0.9, "max_tokens": 64})
        );
        std::fs::write(dir.join("generation_config.json"), "{not json").unwrap();
        assert!(GenerationDefaults::from_model(&dir)
            .unwrap_err()
            .contains("generation_config.json"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
