//! 512-bit AVX512-VNNI tiles for Q4_0, Q4_1 and Q8_0, the formats of the shipped model.
//!
//! A group's quant vector is 64 bytes, four of each of its sixteen rows: one register. Each
//! activation quad is broadcast from memory into the `vpdpbusd` that meets it (EVEX's
//! embedded broadcast), and each block's exact integer sums come out one row per lane, so
//! one instruction does the work of two in the 256-bit kernels and the scales of sixteen
//! rows convert and multiply as one vector. Every lane runs the 256-bit kernels' arithmetic
//! (the same exact integer sum, then the same rounded operations in the same order), so the
//! results are theirs, bit for bit.

use std::arch::x86_64::*;

use super::x86::{prefetch_block, GROUP_PREFETCH, Q8_0_PREFETCH};
use super::{Q8Rows, QuantMatrix, GROUP, VEC_BYTES};
use crate::qdot::QK;
use crate::quant::GgmlType;

/// Whether [`tile_group`] covers `ty`.
pub(super) fn has_tile(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// `out[r][c] = w[g·GROUP + c] · x[i + r]` for Q4_0, Q4_1 and Q8_0 ([`has_tile`]).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX512-F, -BW and -VNNI; `w` must have group `g`, and
/// rows `i..i + R` of `x` must exist, with the same number of blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile_group<const R: usize>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    // SAFETY: (each arm) the caller's contract, forwarded.
    unsafe {
        match w.ty {
            GgmlType::Q8_0 => tile_q8_0::<R>(w, g, x, i),
            GgmlType::Q4_1 => tile_q4::<R, true>(w, g, x, i),
            _ => tile_q4::<R, false>(w, g, x, i),
        }
    }
}

/// Where activation rows `i..i + R` start: quants, scales, sums and half sums.
struct Rows<const R: usize> {
    qs: [*const i8; R],
    d: [*const f32; R],
    s: [*const f32; R],
    halves: [*const [i32; 2]; R],
}

impl<const R: usize> Rows<R> {
    #[inline(always)]
    fn new(x: &Q8Rows, i: usize, nb: usize) -> Self {
        Rows {
            qs: std::array::from_fn(|r| x.qs.as_ptr().wrapping_add((i + r) * nb * QK)),
            d: std::array::from_fn(|r| x.d.as_ptr().wrapping_add((i + r) * nb)),
            s: std::array::from_fn(|r| x.s.as_ptr().wrapping_add((i + r) * nb)),
            halves: std::array::from_fn(|r| x.halves.as_ptr().wrapping_add((i + r) * nb)),
        }
    }
}

/// `Σ_n w[n] · quad n of y`, exact, one weight row per lane.
///
/// # Safety
/// `y` must point to 32 readable bytes; the caller has AVX512-VNNI.
#[inline(always)]
unsafe fn block_sum(w: &[__m512i; 8], y: *const i8) -> __m512i {
    let y = y as *const i32;
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = _mm512_setzero_si512();
        for (n, w) in w.iter().enumerate() {
            let quad = _mm512_set1_epi32(y.add(n).read_unaligned());
            acc = _mm512_dpbusd_epi32(acc, *w, quad);
        }
        acc
    }
}

/// A group's sixteen f16 scales of one block, from `p`.
///
/// # Safety
/// `p` must point to 16 readable f16 values; the caller has AVX512-F.
#[inline(always)]
unsafe fn scales(p: *const half::f16) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
}

// Index loops: the row index `r` selects an accumulator and an activation row.
#[allow(clippy::needless_range_loop)]
/// Q4_0 and Q4_1: a block's 256 bytes are four registers, whose low nibbles are quads 0-3
/// of every row and high nibbles quads 4-7.
#[inline(always)]
unsafe fn tile_q4<const R: usize, const STORED_MIN: bool>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    let nb = w.nb;
    let block_bytes = GROUP * QK / 2;
    let wq = w.qs.as_ptr().wrapping_add(g * nb * block_bytes);
    let wd = w.d.as_ptr().wrapping_add(g * nb * GROUP);
    let wm = w.mins.as_ptr().wrapping_add(g * nb * GROUP);
    let x = Rows::<R>::new(x, i, nb);
    // SAFETY: (whole body) group g holds nb blocks of `block_bytes` quants and GROUP scales
    // (and offsets, for Q4_1) each; activation rows i..i + R hold nb blocks of QK quants and
    // nb scales and sums. The rest is register arithmetic under the contract's features.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
            let mut v = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let raw = _mm512_loadu_si512(q.add(j * VEC_BYTES) as *const __m512i);
                v[j] = _mm512_and_si512(raw, low);
                v[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
            }
            let dw = scales(wd.add(b * GROUP));
            let mw = if STORED_MIN {
                scales(wm.add(b * GROUP))
            } else {
                _mm512_mul_ps(dw, _mm512_set1_ps(-8.0))
            };
            for r in 0..R {
                let isum = block_sum(&v, x.qs[r].add(b * QK));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[r].add(b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
                acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*x.s[r].add(b)), acc[r]);
            }
        }
        store(acc)
    }
}

// Index loops: the row index `r` selects an accumulator and an activation row.
#[allow(clippy::needless_range_loop)]
/// Q8_0: a block's 512 bytes are eight registers. `vpdpbusd` wants unsigned weights, so
/// each quant is offset by 128 (its top bit flipped) and `128 · Σ y` taken off the block's
/// integer sum: exact, as the 256-bit kernels' sign trick, which has no 512-bit form.
#[inline(always)]
unsafe fn tile_q8_0<const R: usize>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    let nb = w.nb;
    let block_bytes = GROUP * QK;
    let wq = w.qs.as_ptr().wrapping_add(g * nb * block_bytes);
    let wd = w.d.as_ptr().wrapping_add(g * nb * GROUP);
    let x = Rows::<R>::new(x, i, nb);
    // SAFETY: (whole body) group g holds nb blocks of `block_bytes` quants and GROUP scales
    // each; activation rows i..i + R hold nb blocks of QK quants, scales and half sums.
    // The rest is register arithmetic under the contract's features.
    unsafe {
        let flip = _mm512_set1_epi8(-128);
        let mut acc = [_mm512_setzero_ps(); R];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(Q8_0_PREFETCH), block_bytes);
            let v: [__m512i; 8] = std::array::from_fn(|n| {
                let raw = _mm512_loadu_si512(q.add(n * VEC_BYTES) as *const __m512i);
                _mm512_xor_si512(raw, flip)
            });
            let dw = scales(wd.add(b * GROUP));
            for r in 0..R {
                let [lo, hi] = *x.halves[r].add(b);
                let offset = _mm512_set1_epi32(128 * (lo + hi));
                let isum = _mm512_sub_epi32(block_sum(&v, x.qs[r].add(b * QK)), offset);
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[r].add(b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
            }
        }
        store(acc)
    }
}

#[inline(always)]
unsafe fn store<const R: usize>(acc: [__m512; R]) -> [[f32; GROUP]; R] {
    let mut out = [[0.0; GROUP]; R];
    for r in 0..R {
        // SAFETY: out[r] holds GROUP = 16 floats; the caller has AVX512-F.
        unsafe { _mm512_storeu_ps(out[r].as_mut_ptr(), acc[r]) };
    }
    out
}
