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
    pub(crate) fn expect_shape(
        self,
        name: &str,
        expected: &[usize],
    ) -> Result<Vec<f32>, LoadError> {
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
pub trait WeightSource: Sync {
    /// The tensor dequantised to f32.
    fn load(&self, name: &str) -> Result<Tensor, LoadError>;
    fn contains(&self, name: &str) -> bool;
    /// The tensor's shape, read without its data where the format allows: what a size the
    /// configuration claims is checked against before it sizes anything.
    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        self.load(name).map(|t| t.shape)
    }
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
    /// Slice `index` of the tensor's first dimension (one expert of a stacked tensor), in
    /// f32: sources that can read a slice alone override this, which reads the whole.
    fn load_index(&self, name: &str, index: usize) -> Result<Tensor, LoadError> {
        let t = self.load(name)?;
        slice_first(name, t, index)
    }
    /// Slice `index` of a tensor of bytes (`u8`: gpt-oss's MXFP4 `*_blocks` and `*_scales`)
    /// and its shape without the first dimension; sources without byte tensors refuse.
    fn load_bytes_index(
        &self,
        name: &str,
        index: usize,
    ) -> Result<(Vec<usize>, Vec<u8>), LoadError> {
        let _ = index;
        Err(LoadError::UnsupportedTensorType {
            tensor: name.to_string(),
            type_name: "U8".into(),
        })
    }
}

/// Tensor `name` as a vector of `len` (a bias), or `None` when the checkpoint has none.
pub(crate) fn optional_vector(
    src: &dyn WeightSource,
    name: &str,
    len: usize,
) -> Result<Option<Vec<f32>>, LoadError> {
    if !src.contains(name) {
        return Ok(None);
    }
    src.load(name)?.expect_shape(name, &[len]).map(Some)
}

/// Slice `index` of `t`'s first dimension.
pub(crate) fn slice_first(name: &str, t: Tensor, index: usize) -> Result<Tensor, LoadError> {
    match t.shape.split_first() {
        Some((&n, rest)) if index < n => {
            let len: usize = rest.iter().product();
            Ok(Tensor {
                shape: rest.to_vec(),
                data: t.data[index * len..(index + 1) * len].to_vec(),
            })
        }
        _ => Err(LoadError::Config(format!(
            "{name} has shape {:?}: no slice {index} of its first dimension",
            t.shape
        ))),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum DType {
    /// What the file holds: quantised blocks stay quantised (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    /// Q4_K, Q5_K, Q6_K, MXFP4), f16 and bf16 tensors stay f16 and bf16; other formats
    /// (Q2_K, Q3_K, the IQ types) are dequantised to f32 until they get kernels of their own.
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

/// vLLM's `--quantization`: re-quantise float weights to a GGML block format at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[allow(non_camel_case_types)] // GGML's names
pub enum Quantization {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl Quantization {
    pub const ALL: [Quantization; 8] = [
        Quantization::Q8_0,
        Quantization::Q4_0,
        Quantization::Q4_1,
        Quantization::Q5_0,
        Quantization::Q5_1,
        Quantization::Q4_K,
        Quantization::Q5_K,
        Quantization::Q6_K,
    ];

    pub fn ggml_type(self) -> GgmlType {
        match self {
            Quantization::Q8_0 => GgmlType::Q8_0,
            Quantization::Q4_0 => GgmlType::Q4_0,
            Quantization::Q4_1 => GgmlType::Q4_1,
            Quantization::Q5_0 => GgmlType::Q5_0,
            Quantization::Q5_1 => GgmlType::Q5_1,
            Quantization::Q4_K => GgmlType::Q4_K,
            Quantization::Q5_K => GgmlType::Q5_K,
            Quantization::Q6_K => GgmlType::Q6_K,
        }
    }

    /// The format for the output projection and the token embeddings (tied, they are the
    /// output projection): below 6 bits, Q6_K, as llama.cpp's quantizer gives
    /// `output.weight`, since rounding the logits' own weights to 4 or 5 bits moves them the
    /// most.
    pub(crate) fn for_output(self) -> Quantization {
        match self {
            Quantization::Q8_0 | Quantization::Q6_K => self,
            _ => Quantization::Q6_K,
        }
    }

    /// The format for rows of `cols` values: this one, or where rows are not whole blocks
    /// of 256 the 32-value format that llama.cpp's quantizer falls back to (Q4_K to Q5_0,
    /// Q5_K to Q5_1, Q6_K to Q8_0); `None` if rows are not whole blocks of 32 either.
    pub(crate) fn ggml_type_for(self, cols: usize) -> Option<GgmlType> {
        let ty = self.ggml_type();
        let fallback = match ty {
            GgmlType::Q4_K => GgmlType::Q5_0,
            GgmlType::Q5_K => GgmlType::Q5_1,
            GgmlType::Q6_K => GgmlType::Q8_0,
            other => other,
        };
        [ty, fallback]
            .into_iter()
            .find(|t| cols.is_multiple_of(t.block_size()))
    }
}

impl std::str::FromStr for Quantization {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Quantization::ALL
            .into_iter()
            .find(|q| q.ggml_type().name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "unknown --quantization {s:?} (supported: q8_0, q4_0, q4_1, q5_0, q5_1, \
                     q4_k, q5_k, q6_k)"
                )
            })
    }
}

/// How the loader keeps weights in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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

    /// The options for the output projection and the token embeddings: see
    /// [`Quantization::for_output`] (Q8_0 where rows are not whole blocks of 256).
    pub(crate) fn for_output(&self) -> LoadOptions {
        let quantization = self.quantization.map(Quantization::for_output);
        LoadOptions {
            quantization,
            ..*self
        }
    }
}
