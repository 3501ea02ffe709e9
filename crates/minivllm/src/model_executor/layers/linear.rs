//! Linear layers: weight matrices as the checkpoint stores them (f32, f16, bf16 or GGML
//! blocks), multiplied by the kernel that reads that format.

use minivllm_kernels::hmatmul::{matmul_half, HalfKind, HalfMatrix};
use minivllm_kernels::matmul::matmul;
use minivllm_kernels::qdot::{has_dot, quantize_to};
use minivllm_kernels::qmatmul::{matmul_quant, mxfp4_scales_fit, QuantMatrix};
use minivllm_kernels::quant::GgmlType;

use crate::model_executor::loader::weights::{DType, LoadOptions, QuantTensor, WeightSource};
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
    /// Projections stacked by rows whose stored formats differ (llama.cpp's `_M` mixes give
    /// v more bits than q and k): each keeps its own format and writes its own columns.
    Stacked {
        parts: Vec<WeightMatrix>,
        rows: usize,
        cols: usize,
    },
}

thread_local! {
    /// One part's output for [`WeightMatrix::Stacked`], kept between calls.
    static PART_OUT: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

impl WeightMatrix {
    /// Rows of several tensors of `cols` columns stacked into one matrix (one tensor when
    /// `parts` has one): q/k/v and gate/up read the same input, so stacked they stream it
    /// through the cores once. They stay quantised when `opts` allow and every part is
    /// stored in the same computable block format.
    pub(crate) fn load_rows(
        src: &dyn WeightSource,
        parts: &[(&str, usize)],
        cols: usize,
        opts: &LoadOptions,
    ) -> Result<Self, LoadError> {
        // The rows and columns come from the model's configuration: every part's stored
        // shape must agree before they size anything.
        for &(name, r) in parts {
            let found = src.tensor_shape(name)?;
            if found != [r, cols] {
                return Err(LoadError::ShapeMismatch {
                    tensor: name.to_string(),
                    found,
                    expected: vec![r, cols],
                });
            }
        }
        let rows = parts.iter().map(|(_, r)| r).sum();
        if opts.dtype != DType::Float32 {
            if let Some(loaded) = load_quantized_parts(src, parts, cols)? {
                return stack_quantized(parts, loaded, rows, cols);
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
        // The first part's buffer grows to hold the others (a large allocation grows by
        // remapping, not copying): a one-part matrix, most of them, is never copied, and
        // each page is written once (first writes to fresh memory are most of a float
        // load's time).
        let mut data = Vec::new();
        for &(name, r) in parts {
            let part = src.load(name)?.expect_shape(name, &[r, cols])?;
            if data.is_empty() {
                data = part;
                data.reserve_exact((rows * cols).saturating_sub(data.len()));
            } else {
                data.extend(part);
            }
        }
        match opts.quantization {
            Some(q) => match q.ggml_type_for(cols) {
                Some(ty) => {
                    let blocks =
                        quantize_to(ty, &data).expect("every --quantization has a quantiser");
                    quant_matrix(parts[0].0, ty, rows, cols, blocks)
                }
                None => {
                    tracing::warn!(
                        tensor = parts[0].0,
                        cols,
                        "rows are not whole {} blocks: kept in f32",
                        q.ggml_type()
                    );
                    Ok(Self::f32(data, rows, cols))
                }
            },
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
            WeightMatrix::F32 { rows, .. } | WeightMatrix::Stacked { rows, .. } => *rows,
            WeightMatrix::Half(h) => h.rows(),
            WeightMatrix::Quant(q) => q.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            WeightMatrix::F32 { cols, .. } | WeightMatrix::Stacked { cols, .. } => *cols,
            WeightMatrix::Half(h) => h.cols(),
            WeightMatrix::Quant(q) => q.cols(),
        }
    }

    /// The blocks, when the matrix is one quantised matrix.
    pub(crate) fn as_quant(&self) -> Option<&QuantMatrix> {
        match self {
            WeightMatrix::Quant(q) => Some(q),
            _ => None,
        }
    }

    /// The matrices that hold the data: the parts of a stack, or this one.
    pub fn leaves(&self) -> &[WeightMatrix] {
        match self {
            WeightMatrix::Stacked { parts, .. } => parts,
            other => std::slice::from_ref(other),
        }
    }

    /// The storage format's name: `F32`, `Q4_1`, ..., or `mixed` for a stack of several.
    pub fn format(&self) -> &'static str {
        match self {
            WeightMatrix::F32 { .. } => "F32",
            WeightMatrix::Half(h) => h.kind().name(),
            WeightMatrix::Quant(q) => q.ty().name(),
            WeightMatrix::Stacked { .. } => "mixed",
        }
    }

    /// Bytes one pass over the matrix reads (all it holds, but for Q6_K's offsets of its
    /// many-row products, 1.9 % of a Q6_K matrix: `QuantMatrix::nbytes`).
    pub(crate) fn nbytes(&self) -> usize {
        match self {
            WeightMatrix::F32 { data, .. } => data.len() * 4,
            WeightMatrix::Half(h) => h.nbytes(),
            WeightMatrix::Quant(q) => q.nbytes(),
            WeightMatrix::Stacked { parts, .. } => parts.iter().map(Self::nbytes).sum(),
        }
    }

    /// Keeps one activation scale per block of 32 in this matrix's quantised products
    /// (`QuantMatrix::keep_block_activation_scales`): for a matrix whose inputs carry
    /// large outliers, a down projection's.
    pub(crate) fn keep_block_activation_scales(&mut self) {
        match self {
            WeightMatrix::Quant(q) => q.keep_block_activation_scales(),
            WeightMatrix::Stacked { parts, .. } => parts
                .iter_mut()
                .for_each(Self::keep_block_activation_scales),
            WeightMatrix::F32 { .. } | WeightMatrix::Half(_) => {}
        }
    }

    /// Floating-point operations (two per multiply-add) of one input row through it.
    pub(crate) fn flops_per_row(&self) -> f64 {
        2.0 * (self.rows() * self.cols()) as f64
    }

    /// Row `r` in f32 (an embedding lookup).
    pub(crate) fn row_into(&self, r: usize, out: &mut [f32]) {
        match self {
            WeightMatrix::F32 { data, cols, .. } => {
                out.copy_from_slice(&data[r * cols..(r + 1) * cols])
            }
            WeightMatrix::Half(h) => h.widen_rows(r, out),
            WeightMatrix::Quant(q) => q.dequantize_row(r, out),
            WeightMatrix::Stacked { parts, .. } => {
                let mut r = r;
                for p in parts {
                    if r < p.rows() {
                        return p.row_into(r, out);
                    }
                    r -= p.rows();
                }
                panic!("row_into: row past the stack's {} rows", self.rows());
            }
        }
    }

    /// A matrix of the given rows, in that order and in the same format; `None` for a
    /// stack of formats. (A draft model's head over part of the vocabulary.)
    pub(crate) fn select_rows(&self, rows: &[usize]) -> Option<WeightMatrix> {
        let cols = self.cols();
        match self {
            WeightMatrix::F32 { data, .. } => Some(Self::f32(
                rows.iter()
                    .flat_map(|&r| &data[r * cols..(r + 1) * cols])
                    .copied()
                    .collect(),
                rows.len(),
                cols,
            )),
            WeightMatrix::Half(h) => {
                // Widened and rounded back: exact.
                let mut data = vec![0.0; rows.len() * cols];
                for (out, &r) in data.chunks_exact_mut(cols).zip(rows) {
                    h.widen_rows(r, out);
                }
                Some(WeightMatrix::Half(HalfMatrix::from_f32(
                    h.kind(),
                    &data,
                    rows.len(),
                    cols,
                )))
            }
            WeightMatrix::Quant(q) => {
                let blocks = rows.iter().flat_map(|&r| q.row_blocks(r)).collect();
                let mut m = QuantMatrix::new(q.ty(), rows.len(), cols, blocks).ok()?;
                if q.keeps_block_activation_scales() {
                    m.keep_block_activation_scales();
                }
                Some(WeightMatrix::Quant(m))
            }
            WeightMatrix::Stacked { .. } => None,
        }
    }

    /// `out[m, rows] = x[m, cols] · Wᵀ`.
    pub(crate) fn matmul(&self, x: &[f32], out: &mut [f32], m: usize) {
        let (rows, cols) = (self.rows(), self.cols());
        let (x, out) = (&x[..m * cols], &mut out[..m * rows]);
        match self {
            WeightMatrix::F32 { data, .. } => matmul(x, data, out, m, cols, rows),
            WeightMatrix::Half(h) => matmul_half(x, h, out, m),
            WeightMatrix::Quant(q) => matmul_quant(x, q, out, m),
            WeightMatrix::Stacked { parts, .. } => {
                // Taken, not borrowed: a nested product on this thread (rayon runs other
                // work while waiting) finds an empty buffer instead of a borrowed one.
                let mut part_out = PART_OUT.take();
                let mut c0 = 0;
                for p in parts {
                    let pr = p.rows();
                    part_out.clear();
                    part_out.resize(m * pr, 0.0);
                    p.matmul(x, &mut part_out, m);
                    for (o, po) in out.chunks_exact_mut(rows).zip(part_out.chunks_exact(pr)) {
                        o[c0..c0 + pr].copy_from_slice(po);
                    }
                    c0 += pr;
                }
                PART_OUT.set(part_out);
            }
        }
    }
}

/// The parts' blocks as one quantised matrix when they share a format, or as a stack of
/// one matrix per part.
fn stack_quantized(
    parts: &[(&str, usize)],
    loaded: Vec<QuantTensor>,
    rows: usize,
    cols: usize,
) -> Result<WeightMatrix, LoadError> {
    let ty = loaded[0].ty;
    if loaded.iter().all(|t| t.ty == ty) {
        // One part is moved as it is: a copy would hold a large tensor (a 262k-token
        // vocabulary's embeddings) twice while it loads.
        let mut parts_data = loaded.into_iter().map(|t| t.data);
        let mut data = parts_data.next().unwrap_or_default();
        for more in parts_data {
            data.extend_from_slice(&more);
        }
        return quant_matrix(parts[0].0, ty, rows, cols, data);
    }
    let parts = parts
        .iter()
        .zip(loaded)
        .map(|(&(name, r), t)| quant_matrix(name, t.ty, r, cols, t.data))
        .collect::<Result<_, _>>()?;
    Ok(WeightMatrix::Stacked { parts, rows, cols })
}

/// The parts' stored blocks, if every part is in a format with a dot product.
fn load_quantized_parts(
    src: &dyn WeightSource,
    parts: &[(&str, usize)],
    cols: usize,
) -> Result<Option<Vec<QuantTensor>>, LoadError> {
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
    Ok(loaded.iter().all(|t| has_dot(t.ty)).then_some(loaded))
}

fn quant_matrix(
    name: &str,
    ty: minivllm_kernels::quant::GgmlType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
) -> Result<WeightMatrix, LoadError> {
    // An MXFP4 scale the kernels cannot hold exactly: the matrix computes in f32 instead.
    if ty == GgmlType::MXFP4 && !mxfp4_scales_fit(&data) {
        tracing::warn!(
            tensor = name,
            "MXFP4 block scales beyond an f16's range: dequantised to f32"
        );
        let mut values = vec![0.0; rows * cols];
        minivllm_kernels::quant::dequantize(ty, &data, &mut values)
            .map_err(|e| LoadError::Config(format!("tensor {name}: {e}")))?;
        return Ok(WeightMatrix::f32(values, rows, cols));
    }
    QuantMatrix::new(ty, rows, cols, data)
        .map(WeightMatrix::Quant)
        .map_err(|e| LoadError::Config(format!("tensor {name}: {e}")))
}

/// A bias-free linear layer, `y = x · Wᵀ`, weights `[out_features, in_features]`.
pub(crate) struct Linear {
    weight: WeightMatrix,
}

impl Linear {
    pub fn new(weight: WeightMatrix) -> Self {
        Self { weight }
    }

    #[cfg(test)]
    pub(crate) fn from_weight(weight: Vec<f32>, in_features: usize, out_features: usize) -> Self {
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
    pub(crate) fn load_merged(
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

    /// [`WeightMatrix::keep_block_activation_scales`].
    pub(crate) fn keep_block_activation_scales(mut self) -> Self {
        self.weight.keep_block_activation_scales();
        self
    }

    pub(crate) fn in_features(&self) -> usize {
        self.weight.cols()
    }

    pub(crate) fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// `out[m, out_features] = x[m, in_features] · Wᵀ`.
    pub fn forward(&self, x: &[f32], out: &mut [f32], m: usize) {
        self.weight.matmul(x, out, m);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;

    use minivllm_kernels::quant::GgmlType;

    use super::*;
    use crate::model_executor::loader::weights::Tensor;

    /// Tensors held in memory in a block format.
    pub(crate) struct Blocks(pub(crate) HashMap<&'static str, QuantTensor>);

    impl WeightSource for Blocks {
        fn load(&self, name: &str) -> Result<Tensor, LoadError> {
            let t = &self.0[name];
            let mut data = vec![0.0; t.shape.iter().product()];
            minivllm_kernels::quant::dequantize(t.ty, &t.data, &mut data).unwrap();
            Ok(Tensor {
                shape: t.shape.clone(),
                data,
            })
        }
        fn contains(&self, name: &str) -> bool {
            self.0.contains_key(name)
        }
        fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
            Ok(self.0.get(name).cloned())
        }
    }

    /// `rows × cols` values in -1..1, quantised to `ty`.
    pub(crate) fn tensor(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> QuantTensor {
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32
                    / 500.0
                    - 1.0
            })
            .collect();
        QuantTensor {
            shape: vec![rows, cols],
            ty,
            data: quantize_to(ty, &x).unwrap(),
        }
    }

    /// A q/k/v stack whose v is stored in more bits (llama.cpp's Q4_K_M) keeps each part in
    /// its format and computes what the parts compute alone, each in its own columns.
    #[test]
    fn parts_in_different_formats_stack_without_conversion() {
        let cols = 512;
        let src = Blocks(HashMap::from([
            ("q", tensor(GgmlType::Q4_K, 24, cols, 1)),
            ("k", tensor(GgmlType::Q4_K, 8, cols, 2)),
            ("v", tensor(GgmlType::Q6_K, 8, cols, 3)),
        ]));
        let opts = LoadOptions::default();
        let parts = [("q", 24), ("k", 8), ("v", 8)];
        let w = WeightMatrix::load_rows(&src, &parts, cols, &opts).unwrap();
        assert_eq!((w.rows(), w.cols(), w.format()), (40, cols, "mixed"));
        let formats: Vec<_> = w.leaves().iter().map(WeightMatrix::format).collect();
        assert_eq!(formats, ["Q4_K", "Q4_K", "Q6_K"]);
        let m = 3;
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 7) % 13) as f32 / 6.0 - 1.0)
            .collect();
        let mut out = vec![0.0; m * 40];
        w.matmul(&x, &mut out, m);
        let mut c0 = 0;
        for (name, rows) in parts {
            let alone = WeightMatrix::load_rows(&src, &[(name, rows)], cols, &opts).unwrap();
            let mut want = vec![0.0; m * rows];
            alone.matmul(&x, &mut want, m);
            for i in 0..m {
                assert_eq!(
                    out[i * 40 + c0..i * 40 + c0 + rows],
                    want[i * rows..(i + 1) * rows]
                );
            }
            let (mut got_row, mut want_row) = (vec![0.0; cols], vec![0.0; cols]);
            w.row_into(c0 + rows - 1, &mut got_row);
            alone.row_into(rows - 1, &mut want_row);
            assert_eq!(got_row, want_row, "{name}");
            c0 += rows;
        }
        // Parts in one format still make one matrix.
        let qk = WeightMatrix::load_rows(&src, &parts[..2], cols, &opts).unwrap();
        assert_eq!(qk.format(), "Q4_K");
        assert_eq!(qk.leaves().len(), 1);
    }

    #[test]
    fn quantization_falls_back_where_rows_are_not_whole_k_blocks() {
        use crate::model_executor::loader::weights::Quantization as Q;
        assert_eq!(Q::Q4_K.ggml_type_for(512), Some(GgmlType::Q4_K));
        assert_eq!(Q::Q4_K.ggml_type_for(576), Some(GgmlType::Q5_0));
        assert_eq!(Q::Q5_K.ggml_type_for(576), Some(GgmlType::Q5_1));
        assert_eq!(Q::Q6_K.ggml_type_for(576), Some(GgmlType::Q8_0));
        assert_eq!(Q::Q4_0.ggml_type_for(40), None);
        assert_eq!("Q4_K".parse::<Q>(), Ok(Q::Q4_K));
        assert!("q3_k".parse::<Q>().unwrap_err().contains("supported"));
    }
}

#[cfg(test)]
mod row_subset_tests {
    use minivllm_kernels::qdot::quantize_to;
    use minivllm_kernels::quant::GgmlType;

    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                ((i.wrapping_mul(2654435761) ^ seed).wrapping_mul(2246822519) >> 8) as f32
                    / (1u32 << 24) as f32
                    * 2.0
                    - 1.0
            })
            .collect()
    }

    /// Tensor parallelism gives each rank a run of a matrix's rows at any offset: a block
    /// format must compute a row's output exactly as the whole matrix does, so that the
    /// ranks' outputs put together are one process's. (The float kernels' edge tiles sum
    /// in another order, so f32/f16/bf16 ranks agree only to rounding.)
    #[test]
    fn any_run_of_rows_computes_what_the_whole_matrix_computes() {
        minivllm_kernels::threading::init_threads(2);
        let (rows, cols) = (45, 512);
        let w = values(rows * cols, 7);
        let make = |q: &str, data: &[f32], r: usize| -> WeightMatrix {
            let ty = *GgmlType::ALL.iter().find(|t| t.name() == q).unwrap();
            let blocks = quantize_to(ty, data).unwrap();
            quant_matrix(q, ty, r, cols, blocks).unwrap()
        };
        let kinds = [
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
        ];
        let mut failed = Vec::new();
        for m in [1, 3, 17] {
            let x = values(m * cols, 99 + m as u32);
            for kind in kinds {
                let whole = make(kind, &w, rows);
                let mut want = vec![0.0; m * rows];
                whole.matmul(&x, &mut want, m);
                for (a, b) in [(0, 15), (15, 30), (30, 45), (1, 2), (3, 44), (17, 40)] {
                    let part = make(kind, &w[a * cols..b * cols], b - a);
                    let mut got = vec![0.0; m * (b - a)];
                    part.matmul(&x, &mut got, m);
                    for i in 0..m {
                        if got[i * (b - a)..(i + 1) * (b - a)] != want[i * rows + a..i * rows + b] {
                            failed.push(format!("{kind}, m {m}, rows {a}..{b}, row {i}"));
                        }
                    }
                }
            }
        }
        assert!(failed.is_empty(), "{failed:#?}");
    }

    /// A draft model's head over part of the vocabulary: the rows picked, in any order, give
    /// the whole matrix's outputs for those rows (bit for bit in a block format, to
    /// rounding in the float ones, whose edge tiles sum in another order).
    #[test]
    fn selected_rows_compute_what_the_whole_matrix_computes() {
        minivllm_kernels::threading::init_threads(2);
        let (rows, cols) = (45, 256);
        let w = values(rows * cols, 3);
        let pick = [40, 0, 17, 16, 44, 3];
        let matrices = [
            WeightMatrix::f32(w.clone(), rows, cols),
            WeightMatrix::Half(HalfMatrix::from_f32(HalfKind::BF16, &w, rows, cols)),
            quant_matrix(
                "q",
                GgmlType::Q8_0,
                rows,
                cols,
                quantize_to(GgmlType::Q8_0, &w).unwrap(),
            )
            .unwrap(),
            quant_matrix(
                "q",
                GgmlType::Q6_K,
                rows,
                cols,
                quantize_to(GgmlType::Q6_K, &w).unwrap(),
            )
            .unwrap(),
        ];
        for whole in matrices {
            let part = whole.select_rows(&pick).unwrap();
            assert_eq!((part.rows(), part.format()), (pick.len(), whole.format()));
            for m in [1, 5] {
                let x = values(m * cols, 11 + m as u32);
                let mut want = vec![0.0; m * rows];
                whole.matmul(&x, &mut want, m);
                let mut got = vec![0.0; m * pick.len()];
                part.matmul(&x, &mut got, m);
                for i in 0..m {
                    for (j, &r) in pick.iter().enumerate() {
                        let (g, w) = (got[i * pick.len() + j], want[i * rows + r]);
                        let exact = whole.format().starts_with('Q');
                        assert!(
                            if exact {
                                g == w
                            } else {
                                (g - w).abs() <= 1e-4 * w.abs().max(1.0)
                            },
                            "{}: m {m}, row {r}: {g} vs {w}",
                            whole.format()
                        );
                    }
                }
            }
        }
    }
}
