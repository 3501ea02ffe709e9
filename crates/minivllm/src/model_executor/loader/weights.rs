//! The model code's one view of stored weights, whatever the file format.

use minivllm_kernels::hmatmul::HalfKind;
use minivllm_kernels::quant::GgmlType;

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
    /// The tensor dequantised to f32.
    fn load(&self, name: &str) -> Result<Tensor, LoadError>;
    fn contains(&self, name: &str) -> bool;
    /// The tensor in its stored block format, when that is one the kernels compute on;
    /// `None` when it is not (then [`WeightSource::load`] gives it in f32).
    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let _ = name;
        Ok(None)
    }
    /// The half-precision format the tensor is stored in, if it is f16 or bf16.
    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        let _ = name;
        None
    }
}

/// A tensor in a GGML block format the kernels compute on directly, shape in PyTorch order.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantTensor {
    pub shape: Vec<usize>,
    pub ty: GgmlType,
    pub data: Vec<u8>,
}

/// vLLM's `--dtype`: the precision float weights are kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DType {
    /// What the file holds: quantised blocks stay quantised (Q4_0, Q4_1, Q8_0), f16 and bf16
    /// tensors stay f16 and bf16; other formats are dequantised to f32 until they get kernels
    /// of their own.
    #[default]
    Auto,
    /// Everything dequantised to f32: the reference path.
    Float32,
    /// Float weights rounded to f16 (quantised blocks stay as they are).
    Float16,
    /// Float weights rounded to bf16 (quantised blocks stay as they are).
    BFloat16,
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DType::Auto),
            "float32" | "float" | "fp32" => Ok(DType::Float32),
            "float16" | "half" | "fp16" => Ok(DType::Float16),
            "bfloat16" | "bf16" => Ok(DType::BFloat16),
            _ => Err(format!(
                "unknown --dtype {s:?} (supported: auto, float32, float16, bfloat16)"
            )),
        }
    }
}

/// vLLM's `--quantization`: re-quantise float weights to a block format at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantization {
    Q8_0,
}

impl Quantization {
    pub fn ggml_type(self) -> GgmlType {
        match self {
            Quantization::Q8_0 => GgmlType::Q8_0,
        }
    }
}

impl std::str::FromStr for Quantization {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q8_0" => Ok(Quantization::Q8_0),
            _ => Err(format!("unknown --quantization {s:?} (supported: q8_0)")),
        }
    }
}

/// How the loader keeps weights in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadOptions {
    pub dtype: DType,
    pub quantization: Option<Quantization>,
}

impl LoadOptions {
    /// Everything in f32, as the Hugging Face reference computes.
    pub const FLOAT32: LoadOptions = LoadOptions {
        dtype: DType::Float32,
        quantization: None,
    };
}
