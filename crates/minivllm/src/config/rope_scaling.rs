//! How rotary frequencies are stretched for long contexts, as configs name it.

use serde_json::Value;

use super::{opt_usize, ConfigError};

/// How rotary frequencies are stretched for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (Hugging Face `rope_type: "linear"`).
    Linear {
        factor: f32,
    },
    /// Phi-3's LongRoPE: one divisor per rotary frequency, `long_factor` when the context
    /// runs past `original_max_position_embeddings` and `short_factor` within it, and cosines
    /// and sines scaled by `attention_factor`.
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
    /// Gemma 4's full-attention layers ("proportional"): of a head's frequencies only the
    /// first `fraction` turn (the others are zero, so their pairs stay as they are), all
    /// divided by `factor`, over the whole head.
    Proportional {
        fraction: f32,
        factor: f32,
    },
    /// One divisor per rotary frequency, as GGUF files store Llama 3 scaling (`rope_freqs.weight`).
    FreqFactors(Vec<f32>),
    /// YaRN (Qwen2.5 and Qwen3 past their 32k, gpt-oss, DeepSeek): frequencies that turn
    /// fewer than `beta_slow` times over the original context are divided by `factor`,
    /// those that turn more than `beta_fast` times are kept, with a linear ramp over the
    /// dims between (their bounds rounded outwards where `truncate`); cosines and sines
    /// scaled by `attention_factor` (`0.1 ln(factor) + 1` unless the config says).
    Yarn {
        factor: f32,
        original_max_position_embeddings: usize,
        beta_fast: f32,
        beta_slow: f32,
        attention_factor: f32,
        truncate: bool,
    },
}

/// YaRN's scale of cosines and sines for a context stretched `factor` times.
pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl RopeScaling {
    /// What cosines and sines are multiplied by (LongRoPE's and YaRN's attention factor).
    pub fn attention_factor(&self) -> Option<f32> {
        match *self {
            Self::LongRope {
                attention_factor, ..
            }
            | Self::Yarn {
                attention_factor, ..
            } => Some(attention_factor),
            _ => None,
        }
    }

    /// Checks the factors are usable for `rotary_dim` rotated dims (NaN fails too: such
    /// values load fine and then yield NaN logits).
    pub fn validate(&self, rotary_dim: usize) -> Result<(), ConfigError> {
        let positive_finite = |x: f32| x.is_finite() && x > 0.0;
        let bad = |what: &str, v: f32| {
            Err(ConfigError::Invalid(format!(
                "rope scaling {what} must be a positive number, got {v}"
            )))
        };
        match self {
            Self::None => Ok(()),
            Self::Linear { factor } if !positive_finite(*factor) => bad("factor", *factor),
            Self::Linear { .. } => Ok(()),
            Self::Proportional { factor, .. } if !positive_finite(*factor) => {
                bad("factor", *factor)
            }
            Self::Proportional { fraction, .. } if !(*fraction > 0.0 && *fraction <= 1.0) => {
                bad("partial_rotary_factor (at most 1)", *fraction)
            }
            Self::Proportional { .. } => Ok(()),
            Self::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                for (what, v) in [
                    ("factor", *factor),
                    ("low_freq_factor", *low_freq_factor),
                    ("high_freq_factor", *high_freq_factor),
                ] {
                    if !positive_finite(v) {
                        return bad(what, v);
                    }
                }
                // The smoothing between the two divides by their difference.
                if high_freq_factor <= low_freq_factor || *original_max_position_embeddings == 0 {
                    return Err(ConfigError::Invalid(format!(
                        "llama3 rope scaling needs high_freq_factor > low_freq_factor and a \
                         positive original_max_position_embeddings, got {high_freq_factor}, \
                         {low_freq_factor}, {original_max_position_embeddings}"
                    )));
                }
                Ok(())
            }
            Self::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                ..
            } => {
                for (what, v) in [
                    ("factor", *factor),
                    ("beta_fast", *beta_fast),
                    ("beta_slow", *beta_slow),
                    ("attention_factor", *attention_factor),
                ] {
                    if !positive_finite(v) {
                        return bad(what, v);
                    }
                }
                if *original_max_position_embeddings == 0 {
                    return bad("original_max_position_embeddings", 0.0);
                }
                Ok(())
            }
            Self::FreqFactors(f) => match f.iter().find(|&&v| !positive_finite(v)) {
                Some(&v) => bad("frequency factor", v),
                None => Ok(()),
            },
            Self::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            } => {
                let half = rotary_dim / 2;
                for (what, f) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                    if f.len() != half {
                        return Err(ConfigError::Invalid(format!(
                            "longrope {what} has {} values for {half} rotary frequencies",
                            f.len()
                        )));
                    }
                    if let Some(&v) = f.iter().find(|&&v| !positive_finite(v)) {
                        return bad(what, v);
                    }
                }
                if !positive_finite(*attention_factor) {
                    return bad("attention_factor", *attention_factor);
                }
                if *original_max_position_embeddings == 0 {
                    return bad("original_max_position_embeddings", 0.0);
                }
                Ok(())
            }
        }
    }
}

/// The rope scaling of a config.json's `rope_scaling` (or transformers 5's
/// `rope_parameters`); `json`, the whole config, for what LongRoPE reads at its top level.
pub(super) fn parse_hf_rope_scaling(
    scaling: Option<&Value>,
    json: &Value,
) -> Result<RopeScaling, ConfigError> {
    let Some(s) = scaling else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| -> Result<f32, ConfigError> {
        s.get(k)
            .and_then(Value::as_f64)
            .map(|v| v as f32)
            .ok_or_else(|| ConfigError::Invalid(format!("rope scaling {kind:?} lacks {k}")))
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor")?,
        }),
        // Each optional, but a number where given.
        "proportional" => Ok(RopeScaling::Proportional {
            fraction: s
                .get("partial_rotary_factor")
                .map_or(Ok(1.0), |_| num("partial_rotary_factor"))?,
            factor: s.get("factor").map_or(Ok(1.0), |_| num("factor"))?,
        }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
        }),
        // "su" is what the first Phi-3 128k checkpoints called it.
        "longrope" | "su" => {
            let factors = |k: &str| -> Result<Vec<f32>, ConfigError> {
                s.get(k)
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!("rope scaling {kind:?} lacks {k}"))
                    })?
                    .iter()
                    .map(|v| {
                        v.as_f64().map(|x| x as f32).ok_or_else(|| {
                            ConfigError::Invalid(format!(
                                "rope scaling {k} holds {v}, not a number"
                            ))
                        })
                    })
                    .collect()
            };
            let (original, factor) = stretch(s, json, "longrope")?;
            // As transformers: cosines and sines grow with the log of the stretch.
            let attention_factor = match s.get("attention_factor").and_then(Value::as_f64) {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
            };
            Ok(RopeScaling::LongRope {
                short_factor: factors("short_factor")?,
                long_factor: factors("long_factor")?,
                original_max_position_embeddings: original,
                attention_factor: attention_factor as f32,
            })
        }
        "yarn" => {
            let (original, factor) = stretch(s, json, "yarn")?;
            let opt = |k: &str| s.get(k).and_then(Value::as_f64);
            let attention_factor = match (
                opt("attention_factor"),
                opt("mscale"),
                opt("mscale_all_dim"),
            ) {
                (Some(a), _, _) => a,
                (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                    yarn_mscale(factor, m) / yarn_mscale(factor, all)
                }
                _ => yarn_mscale(factor, 1.0),
            };
            // A zero or null beta takes the paper's value, as transformers' `or` does.
            let beta = |k: &str, default: f64| opt(k).filter(|&b| b != 0.0).unwrap_or(default);
            Ok(RopeScaling::Yarn {
                factor: factor as f32,
                original_max_position_embeddings: original,
                beta_fast: beta("beta_fast", 32.0) as f32,
                beta_slow: beta("beta_slow", 1.0) as f32,
                attention_factor: attention_factor as f32,
                truncate: s.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            })
        }
        other => Err(ConfigError::Invalid(format!(
            "unsupported rope scaling type {other:?} (supported: default, linear, llama3, \
             longrope, yarn)"
        ))),
    }
}

/// The context a LongRoPE or YaRN config stretches (`original_max_position_embeddings`, in
/// the scaling parameters or at the config's top level) and by how much: its `factor`, or
/// as transformers takes it without one, the model's context over the original.
fn stretch(s: &Value, json: &Value, kind: &str) -> Result<(usize, f64), ConfigError> {
    let original = opt_usize(s, "original_max_position_embeddings")?
        .or(opt_usize(json, "original_max_position_embeddings")?)
        .ok_or_else(|| {
            ConfigError::Invalid(format!(
                "{kind} scaling needs original_max_position_embeddings"
            ))
        })?;
    let factor = match s.get("factor").and_then(Value::as_f64) {
        Some(f) => f,
        None => {
            opt_usize(json, "max_position_embeddings")?.unwrap_or(original) as f64
                / original.max(1) as f64
        }
    };
    Ok((original, factor))
}
