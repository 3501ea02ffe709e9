//! The activation side of [`super::matmul_quant`]: each row of `x` quantised once to
//! ggml's 8-bit blocks of 32, with the per-block numbers the kernels fold in. The tiles read
//! what this module writes, never the reverse; its SIMD quantisers give the scalar
//! reference's bits.

use rayon::prelude::*;

use super::formats::{GgmlType, QK};
use super::kernel::{use_avx2, QKernel};
use super::layout::{QuantMatrix, KSUB};
use super::reference;

/// Activation rows quantised for the kernels: `nb` blocks per row, with scales `d` and
/// block sums `s` (`d · Σ q`, see [`super::reference::BlockQ8`]) as f32.
#[derive(Default)]
pub(super) struct Q8Rows {
    pub(super) qs: Vec<i8>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
    /// `-32 Σ q` over each block's first and last 16 values: Q6_K's offset of each half of
    /// 16 (its quants are stored plus 32), which its integer sums start from, read straight
    /// into a broadcast; four times their sum is the 512-bit Q8_0 kernel's offset.
    pub(super) offsets: Vec<[i32; 2]>,
    /// `Σ q` over each block: what the K-quants' minima multiply, summed in integers
    /// (their activations share one scale per super-block, see [`shared_blocks`]).
    pub(super) qsum: Vec<i16>,
    /// `Σ q` over each block's first and last 16 values: what Q6_K's `-32` times each half's
    /// scale multiplies where its activations share a super-block's scale, as one 32-bit
    /// pair that `vpmaddwd` takes whole.
    pub(super) half_sums: Vec<[i16; 2]>,
    /// `qs` hold each quant plus 128 (its top bit flipped), as unsigned bytes: the 512-bit
    /// Q6_K tile's operands ([`Q8Rows::make_unsigned`]).
    pub(super) unsigned: bool,
}

/// Blocks of 32 that share one activation scale in a product with `w`: a super-block's
/// ([`KSUB`]) for the K-quants (Q4_K, Q5_K and Q6_K), as ggml quantises the K-quants' activations (Q8_K), so
/// that their tiles sum a super-block's sub-block products times the integer sub-block
/// scales exactly and take their float steps once per super-block instead of once per
/// block (on an AVX2 Zen 3, the float steps and the registers they hold were a third of
/// the Q4_K tile's time). One block for every other format, and for a matrix that keeps
/// its activations' block scales (`QuantMatrix::keep_block_activation_scales`).
pub(crate) fn shared_blocks(w: &QuantMatrix) -> usize {
    match w.ty {
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K if !w.block_activations => KSUB,
        _ => 1,
    }
}

impl Q8Rows {
    /// Quantises the `m` rows of `x` (`nb` blocks each; runs of `share` blocks share a
    /// scale, see [`shared_blocks`]), reusing the buffers; prefills split the rows over the
    /// pool (quantising 512 rows on one thread while the other waited was a quarter of a
    /// prefill's time).
    pub(super) fn quantize(&mut self, x: &[f32], m: usize, nb: usize, share: usize) {
        self.unsigned = false;
        self.qs.resize(m * nb * QK, 0);
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.offsets.resize(m * nb, [0; 2]);
        self.qsum.resize(m * nb, 0);
        self.half_sums.resize(m * nb, [0; 2]);
        if nb == 0 {
            return;
        }
        let isa = QuantIsa::best();
        let rows = x
            .par_chunks_exact(nb * QK)
            .zip(self.qs.par_chunks_exact_mut(nb * QK))
            .zip(self.d.par_chunks_exact_mut(nb))
            .zip(self.s.par_chunks_exact_mut(nb))
            .zip(self.offsets.par_chunks_exact_mut(nb))
            .zip(self.qsum.par_chunks_exact_mut(nb))
            .zip(self.half_sums.par_chunks_exact_mut(nb));
        rows.with_min_len(QUANTIZE_ROWS_PER_TASK).for_each(
            |((((((x, qs), d), s), offsets), qsum), half_sums)| {
                let sums = RowSums {
                    d,
                    s,
                    offsets,
                    qsum,
                    half_sums,
                };
                // SAFETY: `isa` is the best this CPU has; x, qs and sums are one row's
                // chunks of nb blocks.
                unsafe { quantize_row(x, qs, sums, share, isa) }
            },
        );
    }

    /// Adds 128 to every quant, for a tile that takes the activations as `vpdpbusd`'s
    /// unsigned operand (the per-block sums stay those of the signed quants).
    pub(super) fn make_unsigned(&mut self) {
        debug_assert!(!self.unsigned);
        self.qs.iter_mut().for_each(|q| *q ^= i8::MIN);
        self.unsigned = true;
    }
}

/// Activation rows quantised per parallel task: a few microseconds of work each.
const QUANTIZE_ROWS_PER_TASK: usize = 16;

/// One activation row's per-block numbers (`nb` each) besides its quants.
pub(super) struct RowSums<'a> {
    pub(super) d: &'a mut [f32],
    pub(super) s: &'a mut [f32],
    pub(super) offsets: &'a mut [[i32; 2]],
    pub(super) qsum: &'a mut [i16],
    pub(super) half_sums: &'a mut [[i16; 2]],
}

/// The activation quantiser's instruction set; every one gives the scalar reference's bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuantIsa {
    Scalar,
    Avx2,
    /// AVX-512 F and BW, present wherever [`QKernel::Avx512Vnni`] or [`QKernel::Amx`] runs.
    Avx512,
}

impl QuantIsa {
    pub(super) fn best() -> QuantIsa {
        if matches!(QKernel::best(), QKernel::Avx512Vnni | QKernel::Amx) {
            QuantIsa::Avx512
        } else if use_avx2() {
            QuantIsa::Avx2
        } else {
            QuantIsa::Scalar
        }
    }
}

/// One row of [`Q8Rows::quantize`]: `nb` blocks into `qs` and `sums`, runs of `share`
/// sharing a scale.
///
/// # Safety
/// The CPU must have `isa` ([`QuantIsa::best`] or lower); `x` and `qs` must hold `nb · QK`
/// values, `nb` being the length of `sums`' slices.
pub(super) unsafe fn quantize_row(
    x: &[f32],
    qs: &mut [i8],
    sums: RowSums,
    share: usize,
    isa: QuantIsa,
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the caller's contract.
        QuantIsa::Avx512 => return unsafe { avx512::quantize_row(x, qs, sums, share) },
        // SAFETY: the caller's contract.
        QuantIsa::Avx2 => return unsafe { avx2::quantize_row(x, qs, sums, share) },
        QuantIsa::Scalar => {}
    }
    let _ = isa;
    let mut sums = sums;
    for b0 in (0..sums.d.len()).step_by(share) {
        quantize_run_into(x, b0, share, qs, &mut sums);
    }
}

/// Blocks `b0..b0 + share` (fewer at the row's end) of an activation row by the scalar
/// reference, sharing a scale, stored into the row's `qs` and `sums`.
pub(super) fn quantize_run_into(
    x: &[f32],
    b0: usize,
    share: usize,
    qs: &mut [i8],
    sums: &mut RowSums,
) {
    let b1 = (b0 + share).min(sums.d.len());
    let amax = reference::abs_max(&x[b0 * QK..b1 * QK]);
    for b in b0..b1 {
        let q = reference::quantize_block_scaled(&x[b * QK..(b + 1) * QK], amax);
        (sums.d[b], sums.s[b]) = (q.d, q.s);
        let half = |h: usize| -> i32 {
            q.qs[h * QK / 2..(h + 1) * QK / 2]
                .iter()
                .map(|&v| v as i32)
                .sum()
        };
        sums.offsets[b] = [-32 * half(0), -32 * half(1)];
        sums.qsum[b] = (half(0) + half(1)) as i16;
        sums.half_sums[b] = [half(0) as i16, half(1) as i16];
        qs[b * QK..(b + 1) * QK].copy_from_slice(&q.qs);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{RowSums, QK};

    /// One activation row quantised as [`crate::quant::reference::quantize_block`] does, bit for bit: the
    /// same `amax / 127` scale and its reciprocal, the same products, and `roundf`'s ties away
    /// from zero (not the vector unit's ties to even, which ggml's own AVX2 path uses), so that
    /// every ISA feeds the dot products the same quants. Writes `qs` (`nb · QK`) and `sums`
    /// (`nb` each).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `x` must hold `nb · QK` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], mut sums: RowSums, share: usize) {
        let nb = sums.d.len();
        debug_assert!(x.len() == nb * QK && qs.len() == nb * QK);
        debug_assert!(sums.s.len() == nb && sums.offsets.len() == nb && sums.qsum.len() == nb);
        // SAFETY (whole body): block b reads x[b·QK..(b+1)·QK] and writes qs at the same
        // offsets, both in bounds by the contract; the rest is register arithmetic under AVX2.
        // SAFETY: the caller's contract, forwarded.
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let half = _mm256_set1_ps(0.5);
            let one = _mm256_set1_ps(1.0);
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let load = |b: usize| -> [__m256; 4] {
                let p = x.as_ptr().add(b * QK);
                std::array::from_fn(|t| _mm256_loadu_ps(p.add(8 * t)))
            };
            for b0 in (0..nb).step_by(share) {
                let b1 = (b0 + share).min(nb);
                let mut amax = _mm256_setzero_ps();
                let mut nan = _mm256_setzero_ps();
                for b in b0..b1 {
                    for vt in load(b) {
                        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, vt));
                        nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(vt, vt));
                    }
                }
                let amax = hmax(amax);
                let dv = amax / 127.0;
                let id = if dv != 0.0 { 1.0 / dv } else { 0.0 };
                if !id.is_finite() || !amax.is_finite() || _mm256_movemask_ps(nan) != 0 {
                    // Subnormal scales and non-finite inputs: the conversions below saturate
                    // differently from Rust's casts, so such runs take the scalar path.
                    super::quantize_run_into(x, b0, share, qs, &mut sums);
                    continue;
                }
                let idv = _mm256_set1_ps(id);
                let dr = f16::from_f32(dv).to_f32();
                for b in b0..b1 {
                    let v = load(b);
                    let q: [__m256i; 4] = std::array::from_fn(|t| {
                        let y = _mm256_mul_ps(v[t], idv);
                        // roundf: truncate, then step away from zero when the dropped part
                        // is at least a half (both steps exact for |y| < 2^23).
                        let t0 = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t0));
                        let away = _mm256_or_ps(_mm256_and_ps(y, sign), one);
                        let step = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), away);
                        _mm256_cvttps_epi32(_mm256_add_ps(t0, step))
                    });
                    let sum = _mm256_add_epi32(
                        _mm256_add_epi32(q[0], q[1]),
                        _mm256_add_epi32(q[2], q[3]),
                    );
                    let packed = _mm256_packs_epi16(
                        _mm256_packs_epi32(q[0], q[1]),
                        _mm256_packs_epi32(q[2], q[3]),
                    );
                    let packed = _mm256_permutevar8x32_epi32(packed, order);
                    _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, packed);
                    let total = hsum_i32(sum);
                    sums.d[b] = dr;
                    sums.s[b] = total as f32 * dr;
                    let low = hsum_i32(_mm256_add_epi32(q[0], q[1]));
                    sums.offsets[b] = [-32 * low, -32 * (total - low)];
                    sums.qsum[b] = total as i16;
                    sums.half_sums[b] = [low as i16, (total - low) as i16];
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn hmax(v: __m256) -> f32 {
        // SAFETY: register-only intrinsics; the caller has AVX.
        unsafe {
            let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
        }
    }

    #[inline(always)]
    unsafe fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: register-only intrinsics; the caller has AVX2.
        unsafe {
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01)))
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{RowSums, QK};

    /// One activation row quantised as [`crate::quant::reference::quantize_block`] does, bit for bit, as
    /// [`super::avx2::quantize_row`] (whose notes on rounding apply), a block in two registers: `vpmovdb`
    /// packs the quants and two reductions give the half sums.
    ///
    /// # Safety
    /// The CPU must have AVX512-F and -BW; `x` must hold `nb · QK` values.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
    pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], mut sums: RowSums, share: usize) {
        let nb = sums.d.len();
        debug_assert!(x.len() == nb * QK && qs.len() == nb * QK);
        debug_assert!(sums.s.len() == nb && sums.offsets.len() == nb && sums.qsum.len() == nb);
        // SAFETY: (whole body) block b reads x[b·QK..(b+1)·QK] and writes qs at the same
        // offsets, both in bounds by the contract; the rest is register arithmetic.
        unsafe {
            let sign = _mm512_set1_epi32(i32::MIN);
            let half = _mm512_set1_ps(0.5);
            let one = _mm512_castps_si512(_mm512_set1_ps(1.0));
            let load = |b: usize| -> [__m512; 2] {
                let p = x.as_ptr().add(b * QK);
                [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
            };
            for b0 in (0..nb).step_by(share) {
                let b1 = (b0 + share).min(nb);
                let mut amax = _mm512_setzero_ps();
                let mut nan = 0;
                for b in b0..b1 {
                    for v in load(b) {
                        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
                        nan |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
                    }
                }
                let amax = _mm512_reduce_max_ps(amax);
                let dv = amax / 127.0;
                let id = if dv != 0.0 { 1.0 / dv } else { 0.0 };
                if !id.is_finite() || !amax.is_finite() || nan != 0 {
                    super::quantize_run_into(x, b0, share, qs, &mut sums);
                    continue;
                }
                let idv = _mm512_set1_ps(id);
                let dr = half::f16::from_f32(dv).to_f32();
                for b in b0..b1 {
                    let q = load(b).map(|v| {
                        let y = _mm512_mul_ps(v, idv);
                        let t0 =
                            _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                        let frac = _mm512_abs_ps(_mm512_sub_ps(y, t0));
                        let away =
                            _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one);
                        let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
                        let step = _mm512_maskz_mov_ps(ge, _mm512_castsi512_ps(away));
                        _mm512_cvttps_epi32(_mm512_add_ps(t0, step))
                    });
                    let out = qs.as_mut_ptr().add(b * QK) as *mut __m128i;
                    _mm_storeu_si128(out, _mm512_cvtepi32_epi8(q[0]));
                    _mm_storeu_si128(out.add(1), _mm512_cvtepi32_epi8(q[1]));
                    let (lo, hi) = (_mm512_reduce_add_epi32(q[0]), _mm512_reduce_add_epi32(q[1]));
                    sums.d[b] = dr;
                    sums.s[b] = (lo + hi) as f32 * dr;
                    sums.offsets[b] = [-32 * lo, -32 * hi];
                    sums.qsum[b] = (lo + hi) as i16;
                    sums.half_sums[b] = [lo as i16, hi as i16];
                }
            }
        }
    }
}
