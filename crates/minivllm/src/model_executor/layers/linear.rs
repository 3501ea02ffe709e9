use minivllm_kernels::hmatmul::{matmul_half, HalfKind, HalfMatrix};
use minivllm_kernels::matmul::matmul;
use minivllm_kernels::qdot::{has_dot, quantize_q8_0};
use minivllm_kernels::qmatmul::{matmul_quant, QuantMatrix};

use crate::model_executor::loader::weights::{
    DType, LoadOptions, QuantTensor, Quantization, WeightSource,
};
use crate::model_executor::loader::LoadError;

/// A `[rows, cols]` weight matrix as kept in memory: f32, f16 or bf16, or the GGML blocks
/// it was stored in (or re-quantised to), which decoding reads 4-8× fewer bytes of.
pub enum WeightMatrix {
    F32 {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
    },
    Half(HalfMatrix),
    Quant(QuantMatrix),
}

impl WeightMatrix {
    /// Rows of several tensors of `cols` columns stacked into one matrix (one tensor when
    /// `parts` has one): q/k/v and gate/up read the same input, so stacked they stream it
    /// through the cores once. They stay quantised when `opts` allow and every part is
    /// stored in the same computable block format.
    pub fn load_rows(
        src: &dyn WeightSource,
        parts: &[(&str, usize)],
        cols: usize,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        let rows = parts.iter().map(|(_, r)| r).sum();
        if opts.dtype != DType::Float32 {
            if let Some((ty, data)) = load_quantized_parts(src, parts, cols)? {
                return quant_matrix(parts[0].0, ty, rows, cols, data);
            }
        }
        // Float weights: `auto` keeps an f16/bf16 checkpoint's precision (widening it to f32
        // and back is exact), `float16`/`bfloat16` round to it, `float32` widens.
        let half = match opts.dtype {
            DType::Float16 => Some(HalfKind::F16),
            DType::BFloat16 => Some(HalfKind::BF16),
            DType::Float32 => None,
            DType::Auto => {
                let kinds: Vec<Option<HalfKind>> = parts
                    .iter()
                    .map(|(name, _)| src.stored_half(name))
                    .collect();
                kinds
                    .iter()
                    .all(|k| *k == kinds[0])
                    .then_some(kinds[0])
                    .flatten()
            }
        };
        let mut data = Vec::with_capacity(rows * cols);
        for &(name, r) in parts {
            data.extend(src.load(name)?.expect_shape(name, &[r, cols])?);
        }
        match opts.quantization {
            Some(q) if cols.is_multiple_of(q.ggml_type().block_size()) => {
                let blocks = match q {
                    Quantization::Q8_0 => quantize_q8_0(&data),
                };
                quant_matrix(parts[0].0, q.ggml_type(), rows, cols, blocks)
            }
            Some(q) => {
                tracing::warn!(
                    tensor = parts[0].0,
                    cols,
                    "rows are not whole {} blocks: kept in f32",
                    q.ggml_type()
                );
                Ok(Self::f32(data, rows, cols))
            }
            None => Ok(match half {
                Some(kind) => WeightMatrix::Half(HalfMatrix::from_f32(kind, &data, rows, cols)),
                None => Self::f32(data, rows, cols),
            }),
        }
    }

    pub fn f32(data: Vec<f32>, rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "weight matrix size");
        WeightMatrix::F32 { data, rows, cols }
    }

    pub fn rows(&self) -> usize {
        match self {
            WeightMatrix::F32 { rows, .. } => *rows,
            WeightMatrix::Half(h) => h.rows(),
            WeightMatrix::Quant(q) => q.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            WeightMatrix::F32 { cols, .. } => *cols,
            WeightMatrix::Half(h) => h.cols(),
            WeightMatrix::Quant(q) => q.cols(),
        }
    }

    /// The storage format's name: `F32`, `Q4_1`, ...
    pub fn format(&self) -> &'static str {
        match self {
            WeightMatrix::F32 { .. } => "F32",
            WeightMatrix::Half(h) => h.kind().name(),
            WeightMatrix::Quant(q) => q.ty().name(),
        }
    }

    /// Bytes held, which is what one pass over the matrix reads.
    pub fn nbytes(&self) -> usize {
        match self {
            WeightMatrix::F32 { data, .. } => data.len() * 4,
            WeightMatrix::Half(h) => h.nbytes(),
            WeightMatrix::Quant(q) => q.nbytes(),
        }
    }

    /// Row `r` in f32 (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        match self {
            WeightMatrix::F32 { data, cols, .. } => {
                out.copy_from_slice(&data[r * cols..(r + 1) * cols])
            }
            WeightMatrix::Half(h) => h.widen_rows(r, out),
            WeightMatrix::Quant(q) => q.dequantize_row(r, out),
        }
    }

    /// `out[m, rows] = x[m, cols] · Wᵀ`.
    pub fn matmul(&self, x: &[f32], out: &mut [f32], m: usize) {
        let (rows, cols) = (self.rows(), self.cols());
        let (x, out) = (&x[..m * cols], &mut out[..m * rows]);
        match self {
            WeightMatrix::F32 { data, .. } => matmul(x, data, out, m, cols, rows),
            WeightMatrix::Half(h) => matmul_half(x, h, out, m),
            WeightMatrix::Quant(q) => matmul_quant(x, q, out, m),
        }
    }
}

/// The parts' stored blocks concatenated, if all are in one format with a dot product.
fn load_quantized_parts(
    src: &dyn WeightSource,
    parts: &[(&str, usize)],
    cols: usize,
) -> Result<Option<(minivllm_kernels::quant::GgmlType, Vec<u8>)>, LoadError> {
    let mut loaded: Vec<QuantTensor> = Vec::with_capacity(parts.len());
    for &(name, rows) in parts {
        let Some(t) = src.load_quantized(name)? else {
            return Ok(None);
        };
        if t.shape != [rows, cols] {
            return Err(LoadError::ShapeMismatch {
                tensor: name.to_string(),
                found: t.shape,
                expected: vec![rows, cols],
            });
        }
        loaded.push(t);
    }
    let ty = loaded[0].ty;
    if !has_dot(ty) || loaded.iter().any(|t| t.ty != ty) {
        // Mixed formats (as llama.cpp's *_M mixes give q and v): stacked in f32 instead.
        return Ok(None);
    }
    let data = loaded
        .iter()
        .map(|t| t.data.as_slice())
        .collect::<Vec<_>>()
        .concat();
    Ok(Some((ty, data)))
}

fn quant_matrix(
    name: &str,
    ty: minivllm_kernels::quant::GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
) -> Result<WeightMatrix, LoadError> {
    QuantMatrix::new(ty, rows, cols, data)
        .map(WeightMatrix::Quant)
        .map_err(|e| LoadError::Config(format!("tensor {name}: {e}")))
}

/// A bias-free linear layer, `y = x · Wᵀ`, weights `[out_features, in_features]`.
pub struct Linear {
    weight: WeightMatrix,
}

impl Linear {
    pub fn new(weight: WeightMatrix) -> Self {
        Self { weight }
    }

    pub fn from_weight(weight: Vec<f32>, in_features: usize, out_features: usize) -> Self {
        Self::new(WeightMatrix::f32(weight, out_features, in_features))
    }

    pub fn load(
        src: &dyn WeightSource,
        name: &str,
        in_features: usize,
        out_features: usize,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        Self::load_merged(src, &[(name, out_features)], in_features, opts)
    }

    /// Stacks several projections that read the same input (q/k/v, gate/up) into one
    /// weight, so the input is streamed through the cores once instead of per projection.
    pub fn load_merged(
        src: &dyn WeightSource,
        parts: &[(&str, usize)],
        in_features: usize,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        WeightMatrix::load_rows(src, parts, in_features, opts).map(Self::new)
    }

    pub fn weight(&self) -> &WeightMatrix {
        &self.weight
    }

    pub fn in_features(&self) -> usize {
        self.weight.cols()
    }

    pub fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// `out[m, out_features] = x[m, in_features] · Wᵀ`.
    pub fn forward(&self, x: &[f32], out: &mut [f32], m: usize) {
        self.weight.matmul(x, out, m);
    }
}
