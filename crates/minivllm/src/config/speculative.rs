//! vLLM's `--speculative-config`: which proposer guesses tokens for the target model to
//! verify, and how many. Only `ngram` (prompt lookup) is here so far; a draft model is
//! refused by name.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeculativeMethod {
    /// Prompt lookup: the tokens that followed the last occurrence of the sequence's final
    /// n-gram in its own prompt and output.
    #[serde(alias = "[ngram]")]
    Ngram,
    /// A smaller model of the same vocabulary (not implemented yet).
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
}

/// The n-gram proposer's settings, resolved and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramConfig {
    pub num_speculative_tokens: usize,
    pub prompt_lookup_min: usize,
    pub prompt_lookup_max: usize,
    pub disable_by_batch_size: Option<usize>,
}

/// Speculative decoding proposes at most this many tokens a step: a bound on the step's
/// extra rows (and vLLM's own checks refuse far less than this is useful).
pub const MAX_SPECULATIVE_TOKENS: usize = 32;

impl SpeculativeConfig {
    /// From `--speculative-config`'s JSON text.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| format!("--speculative-config: {e}"))
    }

    /// The n-gram settings with vLLM's defaults (both bounds 5 when neither is given, one
    /// given standing for both) and its checks; other methods are refused by name.
    pub fn ngram(&self) -> Result<NgramConfig, String> {
        let method = match (self.method, &self.model) {
            (Some(m), _) => m,
            (None, Some(_)) => SpeculativeMethod::DraftModel,
            (None, None) => return Err("speculative_config needs a \"method\" (\"ngram\")".into()),
        };
        if method == SpeculativeMethod::DraftModel {
            return Err(
                "speculative decoding with a draft model is not supported yet; use \
                 {\"method\": \"ngram\", ...}"
                    .into(),
            );
        }
        let k = self.num_speculative_tokens.ok_or(
            "num_speculative_tokens must be provided with speculative model unless the draft \
             model config contains an n_predict parameter.",
        )?;
        if k == 0 || k > MAX_SPECULATIVE_TOKENS {
            return Err(format!(
                "num_speculative_tokens={k} must be between 1 and {MAX_SPECULATIVE_TOKENS}"
            ));
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
        if let Some(b @ 0..=1) = self.disable_by_batch_size {
            return Err(format!(
                "Expect the batch size threshold of disabling speculative decoding is > 1, \
                 but got self.disable_by_batch_size={b}"
            ));
        }
        Ok(NgramConfig {
            num_speculative_tokens: k,
            prompt_lookup_min: min,
            prompt_lookup_max: max,
            disable_by_batch_size: self.disable_by_batch_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_defaults_and_checks_as_vllm() {
        let c = |t: &str| SpeculativeConfig::from_json(t).and_then(|c| c.ngram());
        assert_eq!(
            c(r#"{"method": "ngram", "num_speculative_tokens": 4}"#),
            Ok(NgramConfig {
                num_speculative_tokens: 4,
                prompt_lookup_min: 5,
                prompt_lookup_max: 5,
                disable_by_batch_size: None,
            })
        );
        assert_eq!(
            c(r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}"#)
                .unwrap()
                .prompt_lookup_min,
            4
        );
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
                r#"{"model": "small.gguf", "num_speculative_tokens": 2}"#,
                "draft model is not supported",
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
