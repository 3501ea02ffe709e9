use minivllm_kernels::matmul::matmul;

use crate::model_executor::loader::{weights::WeightSource, LoadError};

/// A bias-free linear layer, `y = x · Wᵀ`, weights `[out_features, in_features]`.
pub struct Linear {
    weight: Vec<f32>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    pub fn from_weight(weight: Vec<f32>, in_features: usize, out_features: usize) -> Self {
        assert_eq!(
            weight.len(),
            in_features * out_features,
            "linear weight size"
        );
        Self {
            weight,
            in_features,
            out_features,
        }
    }

    pub fn load(
        src: &dyn WeightSource,
        name: &str,
        in_features: usize,
        out_features: usize,
    ) -> Result<Self, LoadError> {
        Self::load_merged(src, &[(name, out_features)], in_features)
    }

    /// Stacks several projections that read the same input (q/k/v, gate/up) into one
    /// weight, so the input is streamed through the cores once instead of per projection.
    pub fn load_merged(
        src: &dyn WeightSource,
        parts: &[(&str, usize)],
        in_features: usize,
    ) -> Result<Self, LoadError> {
        let out_features = parts.iter().map(|(_, rows)| rows).sum();
        let mut weight = Vec::with_capacity(out_features * in_features);
        for &(name, rows) in parts {
            weight.extend(src.load(name)?.expect_shape(name, &[rows, in_features])?);
        }
        Ok(Self::from_weight(weight, in_features, out_features))
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// `out[m, out_features] = x[m, in_features] · Wᵀ`.
    pub fn forward(&self, x: &[f32], out: &mut [f32], m: usize) {
        matmul(
            &x[..m * self.in_features],
            &self.weight,
            &mut out[..m * self.out_features],
            m,
            self.in_features,
            self.out_features,
        );
    }
}
