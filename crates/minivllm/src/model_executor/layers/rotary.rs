use minivllm_kernels::rope::rotary_embedding_neox;

use crate::config::{ModelConfig, RopeScaling};

/// Rotary position embedding with its cos/sin table precomputed for every position.
pub struct RotaryEmbedding {
    /// `[max_positions, head_dim]`: per position, `head_dim/2` cosines then as many sines.
    cos_sin_cache: Vec<f32>,
    head_dim: usize,
    max_positions: usize,
}

impl RotaryEmbedding {
    pub fn new(config: &ModelConfig) -> Self {
        let head_dim = config.head_dim;
        let inv_freq = inverse_frequencies(config.rope_theta, head_dim, &config.rope_scaling);
        let max_positions = config.max_position_embeddings;
        let half = head_dim / 2;
        let mut cos_sin_cache = vec![0.0f32; max_positions * head_dim];
        for (pos, row) in cos_sin_cache.chunks_exact_mut(head_dim).enumerate() {
            for (i, &f) in inv_freq.iter().enumerate() {
                // The angle is formed in f32 as transformers does, so long positions round
                // the same way as the reference implementation.
                let angle = pos as f32 * f;
                row[i] = (angle as f64).cos() as f32;
                row[half + i] = (angle as f64).sin() as f32;
            }
        }
        Self {
            cos_sin_cache,
            head_dim,
            max_positions,
        }
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
            self.head_dim,
            &self.cos_sin_cache,
        );
    }
}

/// `1 / theta^(2i/d)`, adjusted by the model's scaling rule.
pub fn inverse_frequencies(theta: f32, head_dim: usize, scaling: &RopeScaling) -> Vec<f32> {
    let base: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    match scaling {
        RopeScaling::None => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::FreqFactors(factors) => base.iter().zip(factors).map(|(f, d)| f / d).collect(),
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
        let plain = inverse_frequencies(500000.0, 128, &RopeScaling::None);
        let scaled = inverse_frequencies(500000.0, 128, &scaling);
        assert_eq!(scaled[0], plain[0]);
        assert!((scaled[63] - plain[63] / 8.0).abs() < 1e-12);
        // In between, the factor moves smoothly from 1 to 1/8.
        for (s, p) in scaled.iter().zip(&plain) {
            let r = s / p;
            assert!((0.125 - 1e-6..=1.0 + 1e-6).contains(&r), "{r}");
        }
    }

    #[test]
    fn linear_scaling_divides_every_frequency() {
        let plain = inverse_frequencies(10000.0, 64, &RopeScaling::None);
        let scaled = inverse_frequencies(10000.0, 64, &RopeScaling::Linear { factor: 4.0 });
        for (s, p) in scaled.iter().zip(&plain) {
            assert_eq!(*s, p / 4.0);
        }
    }
}
