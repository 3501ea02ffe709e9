//! Linear layers over weights kept in f16 or bf16 (`--dtype float16|bfloat16`, and f16/bf16
//! checkpoints as stored).
//!
//! Half the bytes of f32 to hold and, in decode, to stream. Each task widens a slab of its
//! weight rows into an f32 scratch that stays in L2 and runs the f32 product
//! ([`crate::matmul`]) on it: widening is exact, so every output equals the f32 product over
//! the widened matrix, and its cost (one conversion per weight per call) is small against the
//! multiply-adds of a prefill and hidden behind memory in a decode.

use std::cell::RefCell;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::attention::Load;
use crate::matmul::{gemm_nt_any, rows_per_task, Gemm, SendGemm};
use crate::simd::{simd_dispatch, Simd};

/// Weight rows widened at a time: with `k` up to a few thousand, a slab of f32 stays in L2.
const SLAB_ROWS: usize = 64;

/// The half-precision format of a [`HalfMatrix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfKind {
    F16,
    BF16,
}

impl HalfKind {
    /// GGML's name of the format.
    pub fn name(self) -> &'static str {
        match self {
            HalfKind::F16 => "F16",
            HalfKind::BF16 => "BF16",
        }
    }
}

/// A `[rows, cols]` weight matrix in f16 or bf16, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HalfMatrix {
    data: HalfData,
    rows: usize,
    cols: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum HalfData {
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl HalfMatrix {
    /// `data` (`rows × cols` f32, row-major) rounded to `kind`, to nearest, ties to even.
    pub fn from_f32(kind: HalfKind, data: &[f32], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "HalfMatrix: data is not rows × cols"
        );
        let data = match kind {
            HalfKind::F16 => HalfData::F16(data.iter().map(|&x| f16::from_f32(x)).collect()),
            HalfKind::BF16 => HalfData::BF16(data.iter().map(|&x| bf16::from_f32(x)).collect()),
        };
        Self { data, rows, cols }
    }

    pub fn kind(&self) -> HalfKind {
        match self.data {
            HalfData::F16(_) => HalfKind::F16,
            HalfData::BF16(_) => HalfKind::BF16,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held, which is what one pass over the matrix reads.
    pub fn nbytes(&self) -> usize {
        2 * self.rows * self.cols
    }

    /// Rows `r0..r0 + out.len() / cols`, widened into `out`.
    pub fn widen_rows(&self, r0: usize, out: &mut [f32]) {
        let at = r0 * self.cols;
        let end = at + out.len();
        match &self.data {
            HalfData::F16(d) => widen_f16(&d[at..end], out),
            HalfData::BF16(d) => widen_bf16(&d[at..end], out),
        }
    }
}

simd_dispatch! {
    fn widen_f16(src: &[f16], dst: &mut [f32]);
    generic = widen_generic;
    avx512 = crate::simd::Avx512;
    scalar = widen_f16_portable;
}

simd_dispatch! {
    fn widen_bf16(src: &[bf16], dst: &mut [f32]);
    generic = widen_generic;
    avx512 = crate::simd::Avx512;
    scalar = widen_bf16_portable;
}

fn widen_f16_portable(src: &[f16], dst: &mut [f32]) {
    widen_generic(crate::simd::Scalar, src, dst)
}

fn widen_bf16_portable(src: &[bf16], dst: &mut [f32]) {
    widen_generic(crate::simd::Scalar, src, dst)
}

#[inline(always)]
fn widen_generic<S: Simd, T: Load>(s: S, src: &[T], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen: lengths differ");
    let l = S::LANES;
    let mut i = 0;
    while i + l <= src.len() {
        // SAFETY: i + LANES <= len of both slices.
        unsafe { s.store(dst.as_mut_ptr().add(i), T::load(s, src.as_ptr().add(i))) };
        i += l;
    }
    for (d, x) in dst[i..].iter_mut().zip(&src[i..]) {
        *d = x.to_f32();
    }
}

thread_local! {
    /// Each thread's widened slab, kept between calls so that decoding does not allocate.
    static SLAB: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[m, rows] = x[m, cols] · Wᵀ`, threaded over the weight rows.
pub fn matmul_half(x: &[f32], w: &HalfMatrix, out: &mut [f32], m: usize) {
    let (k, n) = (w.cols, w.rows);
    assert_eq!(x.len(), m * k, "matmul_half: x must be [m={m}, k={k}]");
    assert_eq!(out.len(), m * n, "matmul_half: out must be [m={m}, n={n}]");
    if m == 0 || n == 0 {
        return;
    }
    let whole = SendGemm(Gemm::dense(x, &[], out, m, k, n));
    let rows = rows_per_task(m, k, n, rayon::current_num_threads());
    let task = |j0: usize, nj: usize| {
        // Taken out rather than borrowed: while waiting on a parallel loop, rayon may run
        // another product on this thread.
        let mut slab = SLAB.take();
        for s0 in (j0..j0 + nj).step_by(SLAB_ROWS) {
            let sn = SLAB_ROWS.min(j0 + nj - s0);
            slab.resize(sn * k, 0.0);
            w.widen_rows(s0, &mut slab);
            let g = Gemm {
                w: slab.as_ptr(),
                ldw: k,
                out: whole.get().out.wrapping_add(s0),
                n: sn,
                ..whole.get()
            };
            // SAFETY: x holds m rows of k and the slab sn rows of k (checked above and just
            // sized); output columns s0..s0 + sn of every row exist (s0 + sn <= n) and belong
            // to this task alone.
            unsafe { gemm_nt_any(g) };
        }
        SLAB.set(slab);
    };
    if rows >= n {
        task(0, n);
    } else {
        (0..n.div_ceil(rows))
            .into_par_iter()
            .for_each(|t| task(t * rows, rows.min(n - t * rows)));
    }
}

/// Single-threaded reference for [`matmul_half`]: the matrix widened, then the scalar f32
/// product.
pub fn matmul_half_scalar(x: &[f32], w: &HalfMatrix, out: &mut [f32], m: usize) {
    let mut wide = vec![0.0; w.rows * w.cols];
    w.widen_rows(0, &mut wide);
    crate::matmul::matmul_scalar(x, &wide, out, m, w.cols, w.rows);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn matches_scalar_on_odd_shapes() {
        let mut r = rng(7);
        // Decode rows, the packed path (m >= 32), slabs and tasks cut mid-matrix.
        for (m, k, n) in [(1, 17, 5), (3, 64, 130), (40, 96, 200), (1, 576, 1536)] {
            let x = rand_vec(&mut r, m * k);
            let wf = rand_vec(&mut r, n * k);
            for kind in [HalfKind::F16, HalfKind::BF16] {
                let w = HalfMatrix::from_f32(kind, &wf, n, k);
                let mut want = vec![0.0; m * n];
                matmul_half_scalar(&x, &w, &mut want, m);
                let mut got = vec![0.0; m * n];
                matmul_half(&x, &w, &mut got, m);
                let what = format!("{kind:?} {m}x{k}x{n}");
                assert_close(&got, &want, 1e-4, 1e-4, &what);
            }
        }
    }

    #[test]
    fn widening_is_exact_on_every_isa() {
        let mut r = rng(8);
        let xs = rand_vec(&mut r, 37);
        for kind in [HalfKind::F16, HalfKind::BF16] {
            let w = HalfMatrix::from_f32(kind, &xs, 1, 37);
            let mut fast = vec![0.0; 37];
            w.widen_rows(0, &mut fast);
            let mut portable = vec![0.0; 37];
            match &w.data {
                HalfData::F16(d) => widen_f16_portable(d, &mut portable),
                HalfData::BF16(d) => widen_bf16_portable(d, &mut portable),
            }
            assert_eq!(fast, portable, "{kind:?}");
            // Rounding to half keeps values within half a unit of the format's last place.
            let tol = if kind == HalfKind::F16 {
                1.0 / 2048.0
            } else {
                1.0 / 256.0
            };
            assert_close(&fast, &xs, 0.0, tol, &format!("{kind:?} rounding"));
        }
    }
}
