//! vLLM's `--speculative-config`: which proposer guesses tokens for the target model to
//! verify, and how many: `ngram` (prompt lookup) or `draft_model` (a smaller model of the
//! same vocabulary).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the last occurrence of the sequence's final
    /// n-gram in its own prompt and output.
    #[serde(alias = "[ngram]")]
    Ngram,
    /// A smaller model of the same vocabulary, run greedily on its own KV cache.
    DraftModel,
}

/// The JSON vLLM takes, with its names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeConfig {
    pub method: Option<SpeculativeMethod>,
    /// The draft model (for `draft_model`; a model given alone implies it).
    #[serde(default)]
    pub model: Option<String>,
    pub num_speculative_tokens: Option<usize>,
    pub prompt_lookup_max: Option<usize>,
    pub prompt_lookup_min: Option<usize>,
    /// No drafts while more sequences than this are running. Without it the engine still
    /// stops guessing where the batch makes the step compute-bound (measured as it runs).
    #[serde(default)]
    pub disable_by_batch_size: Option<usize>,
    /// Ours, not vLLM's: `false` guesses `num_speculative_tokens` every step instead of
    /// choosing each sequence's draft length from its acceptance and the measured costs.
    #[serde(default)]
    pub adaptive_draft_length: Option<bool>,
}

/// The n-gram proposer's settings, resolved and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    pub num_speculative_tokens: usize,
    pub prompt_lookup_min: usize,
    pub prompt_lookup_max: usize,
    pub disable_by_batch_size: Option<usize>,
}

/// The draft model's settings, resolved and checked (the vocabulary is checked when both
/// tokenizers are loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftModelConfig {
    /// A GGUF file or Hugging Face folder, as `--model` takes.
    pub model: String,
    pub num_speculative_tokens: usize,
    pub disable_by_batch_size: Option<usize>,
}

/// A `--speculative-config`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpeculativeMethodConfig {
    Ngram(NgramConfig),
    DraftModel(DraftModelConfig),
}

impl SpeculativeMethodConfig {
    pub fn num_speculative_tokens(&self) -> usize {
        match self {
            Self::Ngram(c) => c.num_speculative_tokens,
            Self::DraftModel(c) => c.num_speculative_tokens,
        }
    }

    pub(crate) fn disable_by_batch_size(&self) -> Option<usize> {
        match self {
            Self::Ngram(c) => c.disable_by_batch_size,
            Self::DraftModel(c) => c.disable_by_batch_size,
        }
    }
}

/// Speculative decoding proposes at most this many tokens a step: a bound on the step's
/// extra rows (and vLLM's own checks refuse far less than this is useful).
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

impl SpeculativeConfig {
    /// From `--speculative-config`'s JSON text.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("--speculative-config: {e}"))
    }

    /// The method and its settings with vLLM's defaults and checks: for `ngram`, both
    /// bounds 5 when neither is given, one given standing for both; a `model` given alone
    /// means `draft_model`.
    pub fn resolve(&self) -> Result<SpeculativeMethodConfig, String> {
        let method = match (self.method, &self.model) {
            (Some(m), _) => m,
            (None, Some(_)) => SpeculativeMethod::DraftModel,
            (None, None) => {
                return Err(
                    "speculative_config needs a \"method\" (\"ngram\" or \"draft_model\")".into(),
                )
            }
        };
        let k = self.num_speculative_tokens.ok_or(
            "num_speculative_tokens must be provided with speculative model unless the draft \
             model config contains an n_predict parameter.",
        )?;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(format!(
                "num_speculative_tokens={k} must be between 1 and {MAX_SPECULATIVE_TOKENS}"
            ));
        }
        if let Some(b @ 0..=1) = self.disable_by_batch_size {
            return Err(format!(
                "Expect the batch size threshold of disabling speculative decoding is > 1, \
                 but got self.disable_by_batch_size={b}"
            ));
        }
        if method == SpeculativeMethod::DraftModel {
            let model = self.model.clone().ok_or(
                "speculative_config with method \"draft_model\" needs a \"model\" (the draft \
                 model's GGUF file or folder)",
            )?;
            if self.prompt_lookup_min.is_some() || self.prompt_lookup_max.is_some() {
                return Err(
                    "prompt_lookup_min and prompt_lookup_max are for method \"ngram\"".into(),
                );
            }
            return Ok(SpeculativeMethodConfig::DraftModel(DraftModelConfig {
                model,
                num_speculative_tokens: k,
                disable_by_batch_size: self.disable_by_batch_size,
            }));
        }
        if self.model.is_some() {
            return Err("method \"ngram\" takes no \"model\"".into());
        }
        let (min, max) = match (self.prompt_lookup_min, self.prompt_lookup_max) {
            (None, None) => (5, 5),
            (Some(min), None) => (min, min),
            (None, Some(max)) => (max, max),
            (Some(min), Some(max)) => (min, max),
        };
        if min < 1 {
            return Err(format!("prompt_lookup_min={min} must be > 0"));
        }
        if max < 1 {
            return Err(format!("prompt_lookup_max={max} must be > 0"));
        }
        if min > max {
            return Err(format!(
                "prompt_lookup_min={min} must be <= prompt_lookup_max={max}"
            ));
        }
        Ok(SpeculativeMethodConfig::Ngram(NgramConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
            disable_by_batch_size: self.disable_by_batch_size,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks_as_vllm() {
        let c = |t: &str| SpeculativeConfig::from_json(t).and_then(|c| c.resolve());
        assert_eq!(
            c(r#"{"method": "ngram", "num_speculative_tokens": 4}"#),
            Ok(SpeculativeMethodConfig::Ngram(NgramConfig {
                num_speculative_tokens: 4,
                prompt_lookup_min: 5,
                prompt_lookup_max: 5,
                disable_by_batch_size: None,
            }))
        );
        let Ok(SpeculativeMethodConfig::Ngram(n)) =
            c(r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}"#)
        else {
            panic!("ngram");
        };
        assert_eq!(n.prompt_lookup_min, 4);
        let draft = SpeculativeMethodConfig::DraftModel(DraftModelConfig {
            model: "small.gguf".into(),
            num_speculative_tokens: 2,
            disable_by_batch_size: Some(8),
        });
        let alone =
            r#"{"model": "small.gguf", "num_speculative_tokens": 2, "disable_by_batch_size": 8}"#;
        assert_eq!(c(alone).as_ref(), Ok(&draft));
        let named = r#"{"method": "draft_model", "model": "small.gguf", "num_speculative_tokens": 2, "disable_by_batch_size": 8}"#;
        assert_eq!(c(named), Ok(draft));
        for (bad, needle) in [
            (
                r#"{"method": "ngram"}"#,
                "num_speculative_tokens must be provided",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}"#,
                "must be <= prompt_lookup_max=2",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "between 1 and",
            ),
            (
                r#"{"method": "draft_model", "num_speculative_tokens": 2}"#,
                "needs a \"model\"",
            ),
            (
                r#"{"method": "ngram", "model": "small.gguf", "num_speculative_tokens": 2}"#,
                "takes no \"model\"",
            ),
            (r#"{"method": "eagle"}"#, "unknown variant"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 1}"#,
                "threshold of disabling speculative decoding is > 1",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}"#,
                "unknown field",
            ),
        ] {
            let e = c(bad).unwrap_err();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}
