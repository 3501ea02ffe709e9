//! The AVX2 tile of [`super::matmul_quant`]: `R` activation rows × `C` weight rows.

use std::arch::x86_64::*;

use super::{Q8Rows, QuantMatrix, SCALE_GROUP};
use crate::qdot::QK;
use crate::quant::GgmlType;

/// Weight quants are prefetched at the same block of the row this many rows below, i.e. in
/// the tile after next. A fixed byte distance (512 B was tried) lands inside the current
/// tile's own rows when rows are short (SmolLM2's are 288 B), which the loads are about to
/// fetch anyway; 8 rows ahead measured +20 % in one-sequence decode on an AVX2 EPYC.
const PREFETCH_ROWS: usize = 8;

/// `out[r][c] = w[j + c] · x[i + r]`. Each weight block is unpacked once for the `R` rows
/// and each activation block loaded once for the `C` weight rows. Every output is summed in
/// the same order whatever the tile's size, so a row's result does not depend on how many
/// rows share its batch.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C; rows `j..j + C` of `w` and `i..i + R` of `x`
/// must exist, with the same number of blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile<const R: usize, const C: usize>(
    w: &QuantMatrix,
    j: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; C]; R] {
    // SAFETY (all three): forwarded contract.
    match w.ty {
        GgmlType::Q4_0 => unsafe { tile_of::<Q4<false>, R, C>(w, j, x, i) },
        GgmlType::Q4_1 => unsafe { tile_of::<Q4<true>, R, C>(w, j, x, i) },
        _ => unsafe { tile_of::<Q8_0, R, C>(w, j, x, i) },
    }
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: register-only intrinsics; the caller has AVX.
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
}

/// How the tile reads one weight format's quants. Values are `d · q + m` with unsigned
/// quants (`m` per block: Q4_1's stored offset, or `-8d` for Q4_0) or `d · q` with signed
/// ones (then `vpmaddubsw` needs the sign trick).
trait Kind {
    const SIGNED: bool;
    /// Whether `m` is stored (Q4_1) rather than `-8d` (Q4_0); unused when signed.
    const STORED_MIN: bool;
    /// The 32 quants of the block at `p`, as bytes in element order.
    ///
    /// # Safety
    /// The block's quant bytes readable at `p`; AVX2 present.
    unsafe fn unpack(p: *const u8) -> __m256i;
}

/// Q4_0 (`STORED_MIN = false`: the offset is `-8d`) and Q4_1 (the offset is stored).
struct Q4<const STORED_MIN: bool>;
struct Q8_0;

/// 16 bytes of nibbles as 32 bytes: low nibbles (elements 0..16) in the lower half, high
/// nibbles (16..32) in the upper, which is ggml's element order.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `p`, AVX2 present.
    unsafe {
        let raw = _mm_loadu_si128(p as *const __m128i);
        let both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
    }
}

impl<const M: bool> Kind for Q4<M> {
    const SIGNED: bool = false;
    const STORED_MIN: bool = M;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> __m256i {
        // SAFETY: the caller's.
        unsafe { nibbles(p) }
    }
}

impl Kind for Q8_0 {
    const SIGNED: bool = true;
    const STORED_MIN: bool = false;
    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> __m256i {
        // SAFETY: the caller's: 32 readable bytes.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
}

/// Per block and output: `d_w·d_x·Σ q_w·q_x` (an exact integer sum through
/// `vpmaddubsw`/`vpmaddwd`) plus, for unsigned formats, `m·s_x`. Scales are converted and
/// multiplied `SCALE_GROUP` blocks at a time, from the padded scale rows.
// Index loops: `r`, `c` and `b` address several arrays in lockstep.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_of<K: Kind, const R: usize, const C: usize>(
    w: &QuantMatrix,
    j: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; C]; R] {
    let (nb, nbp, qb) = (w.nb, w.nbp, w.quant_bytes());
    let wq: [*const u8; C] = std::array::from_fn(|c| w.qs.as_ptr().wrapping_add((j + c) * nb * qb));
    let wd: [*const u16; C] =
        std::array::from_fn(|c| w.d.as_ptr().wrapping_add((j + c) * nbp) as *const u16);
    let wm: [*const u16; C] =
        std::array::from_fn(|c| w.mins.as_ptr().wrapping_add((j + c) * nbp) as *const u16);
    let xq: [*const i8; R] = std::array::from_fn(|r| x.qs.as_ptr().wrapping_add((i + r) * nb * QK));
    let xd: [*const f32; R] = std::array::from_fn(|r| x.d.as_ptr().wrapping_add((i + r) * nbp));
    let xs: [*const f32; R] = std::array::from_fn(|r| x.s.as_ptr().wrapping_add((i + r) * nbp));
    // SAFETY (whole body): the rows exist by the contract; quants are read for blocks
    // b < nb, scales and sums for whole groups of SCALE_GROUP below nbp (rows are padded to
    // it with zero scales, which add nothing). The rest is register arithmetic under
    // AVX2/FMA/F16C. No i16 overflow in `vpmaddubsw`: unsigned quants are at most 15, and
    // signed ones go through the sign trick with |q| <= 128, |y| <= 127.
    unsafe {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut offs = [[_mm256_setzero_ps(); C]; R];
        let mut scale = [[[0.0f32; SCALE_GROUP]; C]; R];
        for g in (0..nb).step_by(SCALE_GROUP) {
            for c in 0..C {
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd[c].add(g) as *const __m128i));
                let mw = if K::SIGNED {
                    _mm256_setzero_ps()
                } else if K::STORED_MIN {
                    _mm256_cvtph_ps(_mm_loadu_si128(wm[c].add(g) as *const __m128i))
                } else {
                    _mm256_mul_ps(dw, _mm256_set1_ps(-8.0))
                };
                for r in 0..R {
                    let dx = _mm256_loadu_ps(xd[r].add(g));
                    _mm256_storeu_ps(scale[r][c].as_mut_ptr(), _mm256_mul_ps(dw, dx));
                    if !K::SIGNED {
                        let sx = _mm256_loadu_ps(xs[r].add(g));
                        offs[r][c] = _mm256_fmadd_ps(mw, sx, offs[r][c]);
                    }
                }
            }
            for b in 0..SCALE_GROUP.min(nb - g) {
                let blk = g + b;
                let mut u = [_mm256_setzero_si256(); C];
                let mut q = [_mm256_setzero_si256(); C];
                for c in 0..C {
                    // Decoding streams every weight once from memory: asking for bytes a few
                    // rows ahead keeps more loads in flight than the hardware prefetcher
                    // alone (any address is allowed in a prefetch).
                    _mm_prefetch::<_MM_HINT_T0>(
                        wq[c].wrapping_add(blk * qb + PREFETCH_ROWS * nb * qb) as *const i8,
                    );
                    q[c] = K::unpack(wq[c].add(blk * qb));
                    u[c] = if K::SIGNED {
                        _mm256_sign_epi8(q[c], q[c])
                    } else {
                        q[c]
                    };
                }
                for r in 0..R {
                    let y = _mm256_loadu_si256(xq[r].add(blk * QK) as *const __m256i);
                    for c in 0..C {
                        let y = if K::SIGNED {
                            _mm256_sign_epi8(y, q[c])
                        } else {
                            y
                        };
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u[c], y), ones);
                        let sc = _mm256_broadcast_ss(&scale[r][c][b]);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), sc, acc[r][c]);
                    }
                }
            }
        }
        let mut out = [[0.0; C]; R];
        for r in 0..R {
            for c in 0..C {
                out[r][c] = hsum(acc[r][c]) + hsum(offs[r][c]);
            }
        }
        out
    }
}
