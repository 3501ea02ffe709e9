//! Rotary position embedding (RoPE), its scaling variants, and the cosines and sines of one
//! step's positions.

use minivllm_kernels::rope::{fill_cos_sin_rows, rotary_embedding_neox};

use crate::config::{ModelConfig, RopeScaling};

/// Rotary position embedding. The cosines and sines are computed for each step's positions
/// ([`StepRope`]), not tabled for every position the model may reach: a table for Gemma 3's
/// 32,768 positions of 256 dims is 32 MiB per RoPE base (64 MiB for its two), Llama 3.1's
/// 128K positions 64 MiB, while a step's rows cost a few microseconds to compute.
pub(crate) struct RotaryEmbedding {
    inv_freq: Vec<f32>,
    theta: f32,
    scaling: RopeScaling,
    head_dim: usize,
    /// The leading dims of each head that are rotated (all of them but for Phi-4-mini).
    rotary_dim: usize,
    /// Positions must be below this (`--max-model-len`).
    max_positions: usize,
}

/// The cosines and sines of one step's positions, `[tokens, rotary_dim]`: each token's
/// `rotary_dim/2` cosines then as many sines (the kernel's layout). Kept between steps.
#[derive(Default)]
pub(crate) struct StepRope {
    rows: Vec<f32>,
    /// `0..tokens`: token t reads row t.
    index: Vec<usize>,
}

impl StepRope {
    pub fn capacity(&self) -> usize {
        self.rows.capacity() + self.index.capacity()
    }
}

impl RotaryEmbedding {
    pub fn new(config: &ModelConfig) -> Self {
        Self::with_base(config, config.rope_theta, &config.rope_scaling)
    }

    /// With another base and scaling than the config's (Gemma 3's sliding layers).
    pub(crate) fn with_base(config: &ModelConfig, theta: f32, scaling: &RopeScaling) -> Self {
        Self::with_dims(config, config.head_dim, config.rotary_dim, theta, scaling)
    }

    /// For heads of `head_dim` whose first `rotary_dim` dims turn (Gemma 4's full layers,
    /// wider than the model's `head_dim`).
    pub(crate) fn with_dims(
        config: &ModelConfig,
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
    ) -> Self {
        let mut rope = Self {
            inv_freq: Vec::new(),
            theta,
            scaling: scaling.clone(),
            head_dim,
            rotary_dim,
            max_positions: 0,
        };
        rope.set_max_positions(config.max_position_embeddings);
        rope
    }

    /// Positions `0..positions` may be rotated. LongRoPE's factors follow this context: the
    /// long ones when `positions` (the longest sequence the engine will run,
    /// `--max-model-len`) exceeds the original context, as llama.cpp decides by its context
    /// size (transformers decides per forward pass, by the batch's longest position; vLLM by
    /// the batch's too, which would make a sequence's result depend on what it is batched
    /// with).
    pub(crate) fn set_max_positions(&mut self, positions: usize) {
        self.inv_freq = inverse_frequencies(self.theta, self.rotary_dim, &self.scaling, positions);
        self.max_positions = positions;
    }

    pub(crate) fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The cosines and sines of `positions` (each below [`Self::max_positions`]).
    pub(crate) fn prepare(&self, positions: &[usize], step: &mut StepRope) {
        let rot = self.rotary_dim;
        step.rows.resize(positions.len() * rot, 0.0);
        fill_cos_sin_rows(&mut step.rows, rot, &self.inv_freq, positions);
        if let Some(factor) = self.scaling.attention_factor() {
            step.rows.iter_mut().for_each(|x| *x *= factor);
        }
        let have = step.index.len();
        step.index.extend(have..positions.len());
        step.index.truncate(positions.len());
    }

    /// Rotates `x` (`[num_tokens, num_heads, head_dim]`) in place by the positions `step`
    /// was prepared for.
    pub fn forward(&self, step: &StepRope, x: &mut [f32], num_heads: usize) {
        rotary_embedding_neox(
            &step.index,
            x,
            num_heads,
            self.head_dim,
            self.rotary_dim,
            &step.rows,
        );
    }
}

/// `1 / theta^(2i/d)` over the `rotary_dim` rotated dims, adjusted by the model's scaling
/// rule for a context of `positions`.
pub(crate) fn inverse_frequencies(
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
        &RopeScaling::Proportional { fraction, factor } => {
            // As transformers counts them: `int(fraction · d // 2)`.
            let turning = (fraction as f64 * rotary_dim as f64 / 2.0).floor() as usize;
            (base.iter().enumerate())
                .map(|(i, f)| if i < turning { f / factor } else { 0.0 })
                .collect()
        }
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
        &RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            // transformers' `_compute_yarn_parameters`: the dims where `rotations` turns fit
            // the original context, in f64; the ramp and the blend in f32.
            let dim = rotary_dim as f64;
            let ln_base = 2.0 * (theta as f64).ln();
            let correction_dim = |rotations: f32| {
                dim * (original_max_position_embeddings as f64
                    / (rotations as f64 * 2.0 * std::f64::consts::PI))
                    .ln()
                    / ln_base
            };
            let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
            if low == high {
                high += 0.001;
            }
            (0..rotary_dim / 2)
                .map(|i| {
                    let pos_freq = theta.powf((2 * i) as f32 / rotary_dim as f32);
                    let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    let interpolation = 1.0 / (factor * pos_freq);
                    interpolation * (1.0 - extrapolation) + (1.0 / pos_freq) * extrapolation
                })
                .collect()
        }
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

    /// A step's rows are the cosines and sines of its positions, in the order given, at
    /// any position below the bound, however large the model's claimed context.
    #[test]
    fn a_step_holds_its_positions_rows() {
        let json = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 10,
            "max_position_embeddings": 1u64 << 60, // a crafted file's claim costs nothing
        });
        let cfg = ModelConfig::from_hf_json(&json).unwrap();
        let mut rope = RotaryEmbedding::new(&cfg);
        rope.set_max_positions(10_000);
        assert_eq!(rope.max_positions(), 10_000);
        let mut step = StepRope::default();
        rope.prepare(&[9_999, 3, 0], &mut step);
        let hd = cfg.head_dim;
        assert_eq!(step.rows.len(), 3 * hd);
        assert_eq!(step.index, [0, 1, 2]);
        for (row, p) in [(0, 9_999), (1, 3), (2, 0)] {
            let f = rope.inv_freq[1];
            let angle = (p as f32 * f) as f64;
            assert_eq!(step.rows[row * hd + 1], angle.cos() as f32);
            assert_eq!(step.rows[row * hd + hd / 2 + 1], angle.sin() as f32);
        }
        rope.prepare(&[7], &mut step);
        assert_eq!(step.index, [0]);
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
