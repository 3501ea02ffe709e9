//! The model code's one view of stored weights, whatever the file format.

use super::LoadError;

/// A dense f32 tensor, row-major, shape in PyTorch order (`[out_features, in_features]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// The data, after checking the shape is the one the model expects.
    pub fn expect_shape(self, name: &str, expected: &[usize]) -> Result<Vec<f32>, LoadError> {
        if self.shape != expected {
            return Err(LoadError::ShapeMismatch {
                tensor: name.to_string(),
                found: self.shape,
                expected: expected.to_vec(),
            });
        }
        Ok(self.data)
    }
}

/// Weights addressed by their Hugging Face names (`model.layers.0.self_attn.q_proj.weight`);
/// each format's loader maps its own naming and layout onto these.
pub trait WeightSource {
    fn load(&self, name: &str) -> Result<Tensor, LoadError>;
    fn contains(&self, name: &str) -> bool;
}
