//! The activation side of [`super::matmul_quant`]: each row of `x` quantised once to
//! ggml's 8-bit blocks of 32, with the per-block numbers the kernels fold in.

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use super::{avx512, x86};
use super::{use_avx2, QKernel};
use crate::qdot::{self, QK};

/// Activation rows quantised for the kernels: `nb` blocks per row, with scales `d` and
/// block sums `s` (`d · Σ q`, see [`crate::qdot::BlockQ8`]) as f32.
#[derive(Default)]
pub(super) struct Q8Rows {
    pub(super) qs: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    /// `Σ q` over each block's first and last 16 values, for Q6_K's scales per 16 and
    /// the 512-bit Q8_0 kernel's offset.
    pub(super) halves: Vec<[i32; 2]>,
}

impl Q8Rows {
    /// Quantises the `m` rows of `x` (`nb` blocks each), reusing the buffers; prefills
    /// split the rows over the pool (quantising 512 rows on one thread while the other
    /// waited was a quarter of a prefill's time).
    pub(super) fn quantize(&mut self, x: &[f32], m: usize, nb: usize) {
        self.qs.resize(m * nb * QK, 0);
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.halves.resize(m * nb, [0; 2]);
        if nb == 0 {
            return;
        }
        let isa = QuantIsa::best();
        let rows = x
            .par_chunks_exact(nb * QK)
            .zip(self.qs.par_chunks_exact_mut(nb * QK))
            .zip(self.d.par_chunks_exact_mut(nb))
            .zip(self.s.par_chunks_exact_mut(nb))
            .zip(self.halves.par_chunks_exact_mut(nb));
        rows.with_min_len(QUANTIZE_ROWS_PER_TASK)
            .for_each(|((((x, qs), d), s), halves)| {
                let sums = RowSums { d, s, halves };
                // SAFETY: `isa` is the best this CPU has; x, qs and sums are one row's
                // chunks of nb blocks.
                unsafe { quantize_row(x, qs, sums, isa) }
            });
    }
}

/// Activation rows quantised per parallel task: a few microseconds of work each.
const QUANTIZE_ROWS_PER_TASK: usize = 16;

/// One activation row's per-block numbers (`nb` each) besides its quants.
pub(super) struct RowSums<'a> {
    pub(super) d: &'a mut [f32],
    pub(super) s: &'a mut [f32],
    pub(super) halves: &'a mut [[i32; 2]],
}

/// The activation quantiser's instruction set; every one gives the scalar reference's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuantIsa {
    Scalar,
    Avx2,
    /// AVX-512 F and BW, present wherever [`QKernel::Avx512Vnni`] runs.
    Avx512,
}

impl QuantIsa {
    pub(super) fn best() -> QuantIsa {
        if QKernel::best() == QKernel::Avx512Vnni {
            QuantIsa::Avx512
        } else if use_avx2() {
            QuantIsa::Avx2
        } else {
            QuantIsa::Scalar
        }
    }
}

/// One row of [`Q8Rows::quantize`]: `nb` blocks into `qs` and `sums`.
///
/// # Safety
/// The CPU must have `isa` ([`QuantIsa::best`] or lower); `x` and `qs` must hold `nb · QK`
/// values, `nb` being the length of `sums`' slices.
pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], sums: RowSums, isa: QuantIsa) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the caller's contract.
        QuantIsa::Avx512 => return unsafe { avx512::quantize_row(x, qs, sums) },
        // SAFETY: the caller's contract.
        QuantIsa::Avx2 => return unsafe { x86::quantize_row(x, qs, sums) },
        QuantIsa::Scalar => {}
    }
    let _ = isa;
    let mut sums = sums;
    for b in 0..sums.d.len() {
        quantize_block_into(x, b, qs, &mut sums);
    }
}

/// Block `b` of an activation row by the scalar reference, stored into the row's `qs` and
/// `sums`.
pub(super) fn quantize_block_into(x: &[f32], b: usize, qs: &mut [i8], sums: &mut RowSums) {
    let q = qdot::quantize_block(&x[b * QK..(b + 1) * QK]);
    (sums.d[b], sums.s[b]) = (q.d, q.s);
    let half = |h: usize| {
        q.qs[h * QK / 2..(h + 1) * QK / 2]
            .iter()
            .map(|&v| v as i32)
            .sum()
    };
    sums.halves[b] = [half(0), half(1)];
    qs[b * QK..(b + 1) * QK].copy_from_slice(&q.qs);
}
