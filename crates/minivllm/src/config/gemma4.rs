//! Gemma 4's text model: what its layers have that no other family's do. Its full-attention
//! layers have their own head size and KV heads (and may take their values from the key
//! projection), the last layers may read an earlier layer's K/V instead of keeping their
//! own (their MLPs then twice as wide), and every layer may add a per-layer input
//! embedding to its output (E2B, E4B).

use serde_json::Value;

use super::{opt_usize, ConfigError, ModelConfig};

/// Gemma 4's parts of a configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma4Config {
    /// The full-attention layers' head size (`global_head_dim`, 512 in the released models;
    /// transformers 5.19 saves it as each such layer's `per_layer_config.head_dim`).
    pub full_head_dim: usize,
    /// The full-attention layers' KV heads (`num_global_key_value_heads` where
    /// `attention_k_eq_v`, else the model's).
    pub full_kv_heads: usize,
    /// The full-attention layers have no v projection: the values are the raw keys (before
    /// the k norm and RoPE), normed.
    pub k_eq_v: bool,
    /// The last this many layers keep no K/V: each attends to the K/V of the last layer
    /// before them of its own kind (sliding or full).
    pub num_kv_shared_layers: usize,
    /// Those layers' MLPs are twice `intermediate_size` wide.
    pub double_wide_mlp: bool,
    /// The width of the per-layer input embeddings (PLE) and their vocabulary; `None`
    /// without them.
    pub per_layer_input: Option<PerLayerInput>,
}

/// Per-layer input embeddings: each layer `i` gets a `hidden`-wide input per token, from
/// a table of `vocab` rows of `num_hidden_layers × hidden` and a projection of the token's
/// embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerLayerInput {
    pub hidden: usize,
    pub vocab: usize,
}

impl Gemma4Config {
    /// From a `config.json` whose layers are `sliding` (`true`: a sliding-window layer),
    /// the model's KV heads given.
    pub(super) fn from_hf(
        json: &Value,
        sliding: &[bool],
        kv_heads: usize,
    ) -> Result<Self, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if json
            .get("use_bidirectional_attention")
            .and_then(Value::as_str)
            == Some("all")
        {
            return bad("use_bidirectional_attention: \"all\" is not supported".into());
        }
        let k_eq_v = json.get("attention_k_eq_v").and_then(Value::as_bool) == Some(true);
        // The hub's files name the full layers' shape at the top; transformers 5.19 writes it
        // into `per_layer_config` under each full layer's index.
        let mut full_head_dim = opt_usize(json, "global_head_dim")?;
        let mut full_kv_heads = opt_usize(json, "num_global_key_value_heads")?.filter(|_| k_eq_v);
        if let Some(per_layer) = json.get("per_layer_config").and_then(Value::as_object) {
            for (key, layer) in per_layer {
                let i = key
                    .parse::<usize>()
                    .ok()
                    .filter(|&i| i < sliding.len() && !sliding[i]);
                let Some(layer) = layer.as_object().filter(|_| i.is_some()) else {
                    return bad(format!(
                        "per_layer_config {key:?}: only full-attention layers may have their \
                         own shape"
                    ));
                };
                for (field, value) in layer {
                    let slot = match field.as_str() {
                        "head_dim" => &mut full_head_dim,
                        "num_key_value_heads" => &mut full_kv_heads,
                        other => {
                            return bad(format!(
                                "per_layer_config field {other:?} is not supported (supported: \
                                 head_dim, num_key_value_heads)"
                            ))
                        }
                    };
                    let v = value.as_u64().map(|v| v as usize);
                    if v.is_none() || slot.is_some_and(|s| Some(s) != v) {
                        return bad(format!(
                            "per_layer_config: {field} must be one positive integer for every \
                             full-attention layer, got {value}"
                        ));
                    }
                    *slot = v;
                }
            }
        }
        let per_layer = opt_usize(json, "hidden_size_per_layer_input")?.unwrap_or(256);
        let per_layer_input = (per_layer > 0)
            .then(|| -> Result<_, ConfigError> {
                Ok(PerLayerInput {
                    hidden: per_layer,
                    vocab: opt_usize(json, "vocab_size_per_layer_input")?.unwrap_or(262_144),
                })
            })
            .transpose()?;
        let cfg = Self {
            full_head_dim: full_head_dim.unwrap_or(512),
            full_kv_heads: full_kv_heads.unwrap_or(kv_heads),
            k_eq_v,
            num_kv_shared_layers: opt_usize(json, "num_kv_shared_layers")?.unwrap_or(0),
            double_wide_mlp: json.get("use_double_wide_mlp").and_then(Value::as_bool) == Some(true),
            per_layer_input,
        };
        // Checked with the rest of the configuration (`ModelConfig::validate`).
        Ok(cfg)
    }

    /// Checks the sizes against the layers (`true`: sliding).
    pub(super) fn validate(&self, sliding: &[bool]) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let positive = [
            ("global_head_dim", self.full_head_dim),
            ("num_global_key_value_heads", self.full_kv_heads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return bad(format!("{name} must be positive"));
        }
        if self.full_head_dim > super::MAX_HEAD_DIM || !self.full_head_dim.is_multiple_of(2) {
            return bad(format!(
                "global_head_dim {} must be even and at most {}",
                self.full_head_dim,
                super::MAX_HEAD_DIM
            ));
        }
        if let Some(p) = self.per_layer_input {
            if p.vocab == 0 || p.hidden > super::MAX_DIMENSION || p.vocab > super::MAX_DIMENSION {
                return bad(format!(
                    "per-layer inputs of {} × {} are not supported",
                    p.vocab, p.hidden
                ));
            }
        }
        let layers = sliding.len();
        if self.num_kv_shared_layers > 0 {
            let first = layers.checked_sub(self.num_kv_shared_layers);
            for i in first.unwrap_or(0)..layers {
                if first.is_none() || self.kv_source(sliding, i).is_none() {
                    return bad(format!(
                        "num_kv_shared_layers {}: layer {i} has no earlier layer of its kind \
                         to share K/V with",
                        self.num_kv_shared_layers
                    ));
                }
            }
        }
        Ok(())
    }

    /// The first layer that keeps no K/V of its own (the layer count when none).
    pub(crate) fn first_shared(&self, layers: usize) -> usize {
        layers.saturating_sub(self.num_kv_shared_layers)
    }

    /// The layer whose K/V layer `i` attends to, when it keeps none of its own: the last
    /// layer of its kind before the first sharing layer.
    pub(crate) fn kv_source(&self, sliding: &[bool], i: usize) -> Option<usize> {
        let first = self.first_shared(sliding.len());
        if i < first {
            return None;
        }
        (0..first).rev().find(|&j| sliding[j] == sliding[i])
    }
}

/// Each layer's shape, which Gemma 4's layers make differ (every other family's are alike).
impl ModelConfig {
    /// Whether each layer slides (`false` for all where none does).
    pub(super) fn layer_kinds(&self) -> Vec<bool> {
        (0..self.num_hidden_layers)
            .map(|i| self.sliding_layers.get(i).copied().unwrap_or(false))
            .collect()
    }

    /// Layer `i`'s attention shape: `(heads, kv_heads, head_dim)` (Gemma 4's full layers
    /// have their own).
    pub fn layer_attention(&self, i: usize) -> (usize, usize, usize) {
        match &self.gemma4 {
            Some(g) if self.layer_window(i).is_none() => {
                (self.num_attention_heads, g.full_kv_heads, g.full_head_dim)
            }
            _ => (
                self.num_attention_heads,
                self.num_key_value_heads,
                self.head_dim,
            ),
        }
    }

    /// Floats of one position's keys (or values) in a KV cache slot: the widest layer's,
    /// which every layer's slot is sized by.
    pub fn kv_slot_size(&self) -> usize {
        (0..self.num_hidden_layers)
            .map(|i| {
                let (_, kv, hd) = self.layer_attention(i);
                kv * hd
            })
            .max()
            .unwrap_or(0)
    }

    /// The layer whose K/V layer `i` attends to, where it keeps none of its own (Gemma 4's
    /// last `num_kv_shared_layers`).
    pub fn kv_source(&self, i: usize) -> Option<usize> {
        let g = self.gemma4.as_ref()?;
        g.kv_source(&self.layer_kinds(), i)
    }

    /// Layer `i`'s MLP width (Gemma 4's K/V-sharing layers may have twice the width).
    pub fn layer_intermediate_size(&self, i: usize) -> usize {
        match &self.gemma4 {
            Some(g) if g.double_wide_mlp && i >= g.first_shared(self.num_hidden_layers) => {
                2 * self.intermediate_size
            }
            _ => self.intermediate_size,
        }
    }
}
