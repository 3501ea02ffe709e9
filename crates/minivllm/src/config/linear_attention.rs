//! Linear-attention layers (Qwen3.5's Gated DeltaNet, three layers in four): which layers
//! they are and their heads. Such a layer keeps no KV cache but a fixed-size state per
//! sequence (`worker/cache_engine.rs` holds it, `core/kv_cache_manager.rs` hands out its
//! slots).

use minivllm_kernels::gated_delta::DeltaHeads;
use serde_json::Value;

use super::{opt_usize, ConfigError, MAX_DIMENSION, MAX_HEAD_DIM};

#[derive(Debug, Clone, PartialEq)]
pub struct LinearAttentionConfig {
    /// Which layers are linear attention, `[num_hidden_layers]`: the others are the
    /// full-attention layers, which alone have KV.
    pub layers: Vec<bool>,
    pub num_key_heads: usize,
    /// A multiple of `num_key_heads`: value heads are grouped over key heads.
    pub num_value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// The causal convolution's width (`linear_conv_kernel_dim`).
    pub conv_kernel_dim: usize,
    /// Value heads ordered tiled over the key heads, as llama.cpp's converter writes them
    /// (`minivllm_kernels::gated_delta::DeltaHeads::tiled`); Hugging Face's are grouped.
    pub v_heads_tiled: bool,
}

impl LinearAttentionConfig {
    /// From a Qwen3.5 `config.json`: `layer_types` (or `full_attention_interval`, every
    /// fourth layer full by default) and the `linear_*` sizes, with transformers' defaults.
    pub(crate) fn from_hf(json: &Value, layers: usize) -> Result<Self, ConfigError> {
        let kinds = match json.get("layer_types").and_then(Value::as_array) {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(ConfigError::Invalid(format!(
                        "unsupported layer type {t} (supported: linear_attention, \
                         full_attention)"
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let every = opt_usize(json, "full_attention_interval")?
                    .unwrap_or(4)
                    .max(1);
                (0..layers).map(|i| (i + 1) % every != 0).collect()
            }
        };
        let size = |key: &str, default: usize| Ok(opt_usize(json, key)?.unwrap_or(default));
        let cfg = Self {
            layers: kinds,
            num_key_heads: size("linear_num_key_heads", 16)?,
            num_value_heads: size("linear_num_value_heads", 32)?,
            key_head_dim: size("linear_key_head_dim", 128)?,
            value_head_dim: size("linear_value_head_dim", 128)?,
            conv_kernel_dim: size("linear_conv_kernel_dim", 4)?,
            v_heads_tiled: false,
        };
        cfg.validate(layers)?;
        Ok(cfg)
    }

    pub(crate) fn validate(&self, num_hidden_layers: usize) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.layers.len() != num_hidden_layers {
            return bad(format!(
                "{} layer types for {num_hidden_layers} layers",
                self.layers.len()
            ));
        }
        // The KV cache needs at least one group of attention layers.
        if self.layers.iter().all(|&l| l) {
            return bad("every layer is linear attention: at least one must be full".into());
        }
        for (name, v, max) in [
            ("linear_num_key_heads", self.num_key_heads, MAX_DIMENSION),
            (
                "linear_num_value_heads",
                self.num_value_heads,
                MAX_DIMENSION,
            ),
            (
                "linear_key_head_dim",
                self.key_head_dim,
                MAX_HEAD_DIM.min(256),
            ),
            (
                "linear_value_head_dim",
                self.value_head_dim,
                MAX_HEAD_DIM.min(256),
            ),
            ("linear_conv_kernel_dim", self.conv_kernel_dim, 64),
        ] {
            if v == 0 || v > max {
                return bad(format!("{name} must be in 1..={max}, got {v}"));
            }
        }
        if !self.num_value_heads.is_multiple_of(self.num_key_heads) {
            return bad(format!(
                "linear_num_value_heads ({}) is not a multiple of linear_num_key_heads ({})",
                self.num_value_heads, self.num_key_heads
            ));
        }
        let widths = self
            .num_value_heads
            .checked_mul(self.key_head_dim)
            .and_then(|s| s.checked_mul(self.value_head_dim));
        if widths.is_none_or(|w| w > MAX_DIMENSION * 16) {
            return bad("the linear-attention state per layer is too large".into());
        }
        Ok(())
    }

    pub(crate) fn is_linear(&self, layer: usize) -> bool {
        self.layers.get(layer).copied().unwrap_or(false)
    }

    /// A layer's heads, as the kernels take them.
    pub(crate) fn heads(&self) -> DeltaHeads {
        DeltaHeads {
            num_k_heads: self.num_key_heads,
            num_v_heads: self.num_value_heads,
            k_dim: self.key_head_dim,
            v_dim: self.value_head_dim,
            tiled: self.v_heads_tiled,
        }
    }

    /// Channels of the convolution: q, k and v side by side.
    pub(crate) fn conv_dim(&self) -> usize {
        conv_dim(&self.heads())
    }

    /// Floats of one sequence's state in one layer ([`state_lens`]).
    pub(crate) fn state_lens(&self) -> [usize; 2] {
        state_lens(&self.heads(), self.conv_kernel_dim)
    }

    /// How many layers are linear attention.
    pub(crate) fn num_layers(&self) -> usize {
        self.layers.iter().filter(|&&l| l).count()
    }

    /// Bytes of one sequence's state over all the linear layers (f32).
    pub(crate) fn state_bytes_per_seq(&self) -> u64 {
        let [conv, rec] = self.state_lens();
        (self.num_layers() * (conv + rec) * std::mem::size_of::<f32>()) as u64
    }
}

/// Channels of a Gated DeltaNet layer's convolution over `heads`: q, k and v side by side.
pub(crate) fn conv_dim(heads: &DeltaHeads) -> usize {
    2 * heads.num_k_heads * heads.k_dim + heads.num_v_heads * heads.v_dim
}

/// Floats of one sequence's state in one layer of `heads` and convolution width
/// `conv_width`: the convolution's last `conv_width − 1` inputs, then the delta rule's
/// `[value heads, key_head_dim, value_head_dim]`. The one formula the cache (sizing the
/// slots) and the layer (checking them) both use.
pub(crate) fn state_lens(heads: &DeltaHeads, conv_width: usize) -> [usize; 2] {
    [conv_dim(heads) * (conv_width - 1), heads.state_len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_fourth_layer_is_full_attention_by_default() {
        let c = LinearAttentionConfig::from_hf(&json!({}), 8).unwrap();
        assert_eq!(c.layers, [true, true, true, false, true, true, true, false]);
        // Qwen3.5's defaults: 16 key heads, 32 value heads of 128, width 4.
        assert_eq!(c.conv_dim(), 2 * 16 * 128 + 32 * 128);
        assert_eq!(c.state_lens(), [8192 * 3, 32 * 128 * 128]);
        assert_eq!(c.state_bytes_per_seq(), 6 * (8192 * 3 + 32 * 128 * 128) * 4);
    }

    #[test]
    fn bad_layer_types_and_heads_are_refused() {
        let e = LinearAttentionConfig::from_hf(
            &json!({"layer_types": ["linear_attention", "sliding_attention"]}),
            2,
        )
        .unwrap_err();
        assert!(e.to_string().contains("sliding_attention"), "{e}");
        let e = LinearAttentionConfig::from_hf(&json!({"layer_types": ["linear_attention"]}), 1)
            .unwrap_err();
        assert!(e.to_string().contains("at least one must be full"), "{e}");
        let e = LinearAttentionConfig::from_hf(
            &json!({"linear_num_key_heads": 3, "linear_num_value_heads": 4}),
            4,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        let e = LinearAttentionConfig::from_hf(&json!({"linear_key_head_dim": 0}), 4).unwrap_err();
        assert!(e.to_string().contains("linear_key_head_dim"), "{e}");
    }
}
