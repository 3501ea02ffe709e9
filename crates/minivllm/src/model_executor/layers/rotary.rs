use minivllm_kernels::rope::{fill_cos_sin_cache, rotary_embedding_neox};

use crate::config::{ModelConfig, RopeScaling};

/// Rotary position embedding with its cos/sin table precomputed for every position in use.
pub struct RotaryEmbedding {
    /// `[max_positions, rotary_dim]`: per position, `rotary_dim/2` cosines then as many sines.
    cos_sin_cache: Vec<f32>,
    inv_freq: Vec<f32>,
    theta: f32,
    scaling: RopeScaling,
    head_dim: usize,
    /// The leading dims of each head that are rotated (all of them but for Phi-4-mini).
    rotary_dim: usize,
    max_positions: usize,
}

/// Positions tabled at load. The engine then sizes the table to `--max-model-len`
/// ([`RotaryEmbedding::resize`]): the model's own context (128K for Llama 3.1, or whatever a
/// file claims) would cost memory that the run never uses, or abort on a crafted value.
const INITIAL_POSITIONS: usize = 8192;

/// Why a RoPE table could not be sized.
#[derive(Debug, thiserror::Error)]
#[error("cannot allocate the RoPE table for {positions} positions ({bytes} bytes)")]
pub struct RopeTableError {
    pub positions: usize,
    pub bytes: u128,
}

impl RotaryEmbedding {
    /// The table for the model's first positions (an error if it cannot be allocated).
    pub fn new(config: &ModelConfig) -> Result<Self, RopeTableError> {
        Self::with_base(config, config.rope_theta, &config.rope_scaling)
    }

    /// The table of another base and scaling than the config's (Gemma 3's sliding layers).
    pub fn with_base(
        config: &ModelConfig,
        theta: f32,
        scaling: &RopeScaling,
    ) -> Result<Self, RopeTableError> {
        let mut rope = Self {
            cos_sin_cache: Vec::new(),
            inv_freq: Vec::new(),
            theta,
            scaling: scaling.clone(),
            head_dim: config.head_dim,
            rotary_dim: config.rotary_dim,
            max_positions: 0,
        };
        rope.resize(config.max_position_embeddings.min(INITIAL_POSITIONS))?;
        Ok(rope)
    }

    /// Tables positions `0..positions` (allocation failure is an error, not an abort).
    /// LongRoPE's factors follow the context: the long ones when `positions` (the longest
    /// sequence the engine will run, `--max-model-len`) exceeds the original context, as
    /// llama.cpp decides by its context size (transformers decides per forward pass, by the
    /// batch's longest position; vLLM by the batch's too, which would make a sequence's
    /// result depend on what it is batched with).
    pub fn resize(&mut self, positions: usize) -> Result<(), RopeTableError> {
        let rot = self.rotary_dim;
        let too_big = || RopeTableError {
            positions,
            bytes: positions as u128 * rot as u128 * 4,
        };
        let len = positions.checked_mul(rot).ok_or_else(too_big)?;
        let mut table = Vec::new();
        table.try_reserve_exact(len).map_err(|_| too_big())?;
        table.resize(len, 0.0f32);
        self.inv_freq = inverse_frequencies(self.theta, rot, &self.scaling, positions);
        fill_cos_sin_cache(&mut table, rot, &self.inv_freq);
        if let RopeScaling::LongRope {
            attention_factor, ..
        } = self.scaling
        {
            table.iter_mut().for_each(|x| *x *= attention_factor);
        }
        self.cos_sin_cache = table;
        self.max_positions = positions;
        Ok(())
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates `x` (`[num_tokens, num_heads, head_dim]`) in place.
    pub fn forward(&self, positions: &[usize], x: &mut [f32], num_heads: usize) {
        rotary_embedding_neox(
            positions,
            x,
            num_heads,
            self.head_dim,
            self.rotary_dim,
            &self.cos_sin_cache,
        );
    }
}

/// `1 / theta^(2i/d)` over the `rotary_dim` rotated dims, adjusted by the model's scaling
/// rule for a context of `positions`.
pub fn inverse_frequencies(
    theta: f32,
    rotary_dim: usize,
    scaling: &RopeScaling,
    positions: usize,
) -> Vec<f32> {
    let base: Vec<f32> = (0..rotary_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / rotary_dim as f32))
        .collect();
    let divided = |factors: &[f32]| base.iter().zip(factors).map(|(f, d)| f / d).collect();
    match scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::FreqFactors(factors) => divided(factors),
        RopeScaling::LongRope {
            short_factor,
            long_factor,
            original_max_position_embeddings,
            ..
        } => divided(if positions > *original_max_position_embeddings {
            long_factor
        } else {
            short_factor
        }),
        &RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let old_ctx = original_max_position_embeddings as f32;
            let low_freq_wavelen = old_ctx / low_freq_factor;
            let high_freq_wavelen = old_ctx / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_ctx / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let plain = inverse_frequencies(500000.0, 128, &RopeScaling::None, 1);
        let scaled = inverse_frequencies(500000.0, 128, &scaling, 1);
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[63] - plain[63] / 8.0).abs() < 1e-12);
        // In between, the factor moves smoothly from 1 to 1/8.
        for (s, p) in scaled.iter().zip(&plain) {
            let r = s / p;
            assert!((0.125 - 1e-6..=1.0 + 1e-6).contains(&r), "{r}");
        }
    }

    #[test]
    fn table_is_sized_on_demand_and_refuses_absurd_sizes() {
        let json = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
            "max_position_embeddings": 1u64 << 60, // a crafted file's claim
        });
        let cfg = ModelConfig::from_hf_json(&json).unwrap();
        let mut rope = RotaryEmbedding::new(&cfg).unwrap();
        assert_eq!(rope.max_positions(), INITIAL_POSITIONS);
        let small = RotaryEmbedding::new(&ModelConfig {
            max_position_embeddings: 100,
            ..cfg.clone()
        })
        .unwrap();
        assert_eq!(small.max_positions(), 100);
        assert!(rope.resize(1 << 60).is_err());
        assert!(rope.resize(usize::MAX).is_err());
        rope.resize(10_000).unwrap();
        assert_eq!(rope.max_positions(), 10_000);
        // Row p holds cos/sin of p · inv_freq, whatever size the table was built at.
        let (hd, p) = (cfg.head_dim, 9_999);
        let f = rope.inv_freq[1];
        assert_eq!(
            rope.cos_sin_cache[p * hd + 1],
            ((p as f32 * f) as f64).cos() as f32
        );
    }

    #[test]
    fn linear_scaling_divides_every_frequency() {
        let plain = inverse_frequencies(10000.0, 64, &RopeScaling::None, 1);
        let scaled = inverse_frequencies(10000.0, 64, &RopeScaling::Linear { factor: 4.0 }, 1);
        for (s, p) in scaled.iter().zip(&plain) {
            assert_eq!(*s, p / 4.0);
        }
    }
}
