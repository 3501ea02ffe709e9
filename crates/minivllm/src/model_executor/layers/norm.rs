//! RMSNorm, as every family here normalises (with Gemma's `1 + weight` scale).

use minivllm_kernels::norm;

use crate::model_executor::loader::{weights::WeightSource, LoadError};

/// RMSNorm with a learned per-channel scale.
pub(crate) struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    pub fn load(
        src: &dyn WeightSource,
        name: &str,
        dim: usize,
        eps: f32,
    ) -> Result<Self, LoadError> {
        let weight = src.load(name)?.expect_shape(name, &[dim])?;
        Ok(Self { weight, eps })
    }

    /// With a weight of ones: a norm with no scale of its own (Gemma 4's norm of v).
    pub(crate) fn unit(dim: usize, eps: f32) -> Self {
        Self {
            weight: vec![1.0; dim],
            eps,
        }
    }

    /// Adds `offset` to every weight (Gemma's `x·(1 + w)`, in f32 as transformers computes it).
    pub(crate) fn with_weight_offset(mut self, offset: f32) -> Self {
        if offset != 0.0 {
            self.weight.iter_mut().for_each(|w| *w += offset);
        }
        self
    }

    /// `out = rms_norm(x)`, row by row (rows as long as the weight).
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        norm::rms_norm(x, &self.weight, self.eps, out);
    }

    /// `residual += x; x = rms_norm(residual)`: one pass instead of an add then a norm.
    pub(crate) fn forward_fused_add(&self, x: &mut [f32], residual: &mut [f32]) {
        norm::fused_add_rms_norm(x, residual, &self.weight, self.eps);
    }
}
