//! 512-bit AVX512-VNNI tiles, for every format the groups layout holds.
//!
//! A group's quant vector is 64 bytes, four of each of its sixteen rows: one register. Each
//! activation quad is broadcast from memory into the `vpdpbusd` that meets it (EVEX's
//! embedded broadcast), and each block's exact integer sums come out one row per lane, so
//! one instruction does the work of two in the 256-bit kernels and the scales of sixteen
//! rows convert and multiply as one vector. Every lane runs the 256-bit kernels' arithmetic
//! (the same exact integer sum, then the same rounded operations in the same order), so the
//! results are theirs, bit for bit.

use std::arch::x86_64::*;

use super::x86::{
    prefetch_block, XRows, GROUP_PREFETCH, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0_PREFETCH,
};
use super::{hbits_bytes, Q8Rows, QuantMatrix, RowSums, GROUP, KSUB, SUB_BYTES, VEC_BYTES};
use crate::qdot::QK;
use crate::quant::GgmlType;

/// `out[r][c] = w[g·GROUP + c] · x[i + r]`.
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
            GgmlType::Q4_0 => tile_nibbles::<R, Q4_0>(w, g, x, i),
            GgmlType::Q4_1 => tile_nibbles::<R, Q4_1>(w, g, x, i),
            GgmlType::Q5_0 => tile_nibbles::<R, Q5_0>(w, g, x, i),
            GgmlType::Q5_1 => tile_nibbles::<R, Q5_1>(w, g, x, i),
            GgmlType::Q4_K => tile_nibbles::<R, Q4_K>(w, g, x, i),
            GgmlType::Q5_K => tile_nibbles::<R, Q5_K>(w, g, x, i),
            GgmlType::Q6_K => tile_nibbles::<R, Q6_K>(w, g, x, i),
            _ => tile_q8_0::<R>(w, g, x, i),
        }
    }
}

/// `Σ_n w[n] · quad n of y` over `N` quads, exact, one weight row per lane.
///
/// # Safety
/// `y` must point to `4 N` readable bytes; the caller has AVX512-VNNI.
#[inline(always)]
unsafe fn quad_sum<const N: usize>(w: &[__m512i; N], y: *const i8) -> __m512i {
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
    let x = XRows::<R>::new(x, i, nb);
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
                let isum = _mm512_sub_epi32(quad_sum(&v, x.qs[r].add(b * QK)), offset);
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[r].add(b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
            }
        }
        store(acc)
    }
}

// Index loops: the nibble index selects a register and a shift; `r` an accumulator and a row.
#[allow(clippy::needless_range_loop)]
/// The formats stored as nibbles (4-, 5- and 6-bit, plain and K-quants):
/// `x86::tile_group_nibbles`'s arithmetic on whole groups, lane for lane. A block's 256
/// quant bytes are four registers, whose low nibbles are quads 0-3 of every row and high
/// nibbles quads 4-7; the bits above the nibbles come from the high-bit planes (a group's
/// 64 bytes per nibble vector here), the sub-block scales of sixteen rows are widened at
/// once, and the integer sums need no widening steps: `vpdpbusd` sums in 32 bits.
#[inline(always)]
unsafe fn tile_nibbles<const R: usize, const F: u8>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    const { assert!(F <= Q6_K) };
    let per_block = F <= Q5_1;
    let nb = w.nb;
    let block_bytes = GROUP * QK / 2;
    let hb = hbits_bytes(w.ty);
    let wq = w.qs.as_ptr().wrapping_add(g * nb * block_bytes);
    let wsub = w.sub.as_ptr().wrapping_add(g * nb * SUB_BYTES);
    let wh = w.hbits.as_ptr().wrapping_add(g * nb * hb);
    let scales_per_group = if per_block { nb } else { nb / KSUB };
    let wd = w.d.as_ptr().wrapping_add(g * scales_per_group * GROUP);
    let wm = w.mins.as_ptr().wrapping_add(g * scales_per_group * GROUP);
    let x = XRows::<R>::new(x, i, nb);
    // SAFETY: (whole body) group g holds nb blocks of `block_bytes` quants and `hb`
    // high-bit bytes, `scales_per_group` scales (and minima, for Q5_1, Q4_K and Q5_K) of
    // GROUP rows each, and SUB_BYTES scale bytes per block for K-quants; activation rows
    // i..i + R hold nb blocks of QK quants, scales, sums and half sums. The rest is register
    // arithmetic under the contract's features.
    unsafe {
        let low = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); R];
        let (mut dsup, mut msup) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for b in 0..nb {
            if per_block || b % KSUB == 0 {
                let at = if per_block { b } else { b / KSUB } * GROUP;
                dsup = scales(wd.add(at));
                if matches!(F, Q4_1 | Q5_1 | Q4_K | Q5_K) {
                    msup = scales(wm.add(at));
                }
            }
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
            prefetch_block(wh.wrapping_add((b + GROUP_PREFETCH / block_bytes) * hb), hb);
            let mut v = [_mm512_setzero_si512(); 8];
            for j in 0..4 {
                let raw = _mm512_loadu_si512(q.add(j * VEC_BYTES) as *const __m512i);
                v[j] = _mm512_and_si512(raw, low);
                v[4 + j] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), low);
            }
            if F == Q5_0 || F == Q5_1 || F == Q5_K {
                let h = _mm512_loadu_si512(wh.add(b * hb) as *const __m512i);
                let bit = _mm512_set1_epi8(0x10);
                let or = |v: __m512i, h: __m512i| _mm512_or_si512(v, _mm512_and_si512(h, bit));
                v[0] = or(v[0], _mm512_slli_epi16::<4>(h));
                v[1] = or(v[1], _mm512_slli_epi16::<3>(h));
                v[2] = or(v[2], _mm512_slli_epi16::<2>(h));
                v[3] = or(v[3], _mm512_slli_epi16::<1>(h));
                v[4] = or(v[4], h);
                v[5] = or(v[5], _mm512_srli_epi16::<1>(h));
                v[6] = or(v[6], _mm512_srli_epi16::<2>(h));
                v[7] = or(v[7], _mm512_srli_epi16::<3>(h));
            }
            if F == Q6_K {
                let top = _mm512_set1_epi8(0x30);
                let or = |v: __m512i, h: __m512i| _mm512_or_si512(v, _mm512_and_si512(h, top));
                for p in 0..2 {
                    let at = b * hb + VEC_BYTES * p;
                    let h = _mm512_loadu_si512(wh.add(at) as *const __m512i);
                    v[4 * p] = or(v[4 * p], _mm512_slli_epi16::<4>(h));
                    v[4 * p + 1] = or(v[4 * p + 1], _mm512_slli_epi16::<2>(h));
                    v[4 * p + 2] = or(v[4 * p + 2], h);
                    v[4 * p + 3] = or(v[4 * p + 3], _mm512_srli_epi16::<2>(h));
                }
            }
            let s = wsub.wrapping_add(b * SUB_BYTES);
            let sub = |at: usize| _mm_loadu_si128(s.add(at) as *const __m128i);
            let (dlo, dhi, mlo);
            if F == Q4_0 || F == Q5_0 {
                (dlo, dhi) = (dsup, dsup);
                let offset = if F == Q4_0 { -8.0 } else { -16.0 };
                mlo = _mm512_mul_ps(dsup, _mm512_set1_ps(offset));
            } else if F == Q4_1 || F == Q5_1 {
                (dlo, dhi, mlo) = (dsup, dsup, msup);
            } else if F == Q6_K {
                let (s0, s1) = (sub(0), sub(GROUP));
                dlo = _mm512_mul_ps(dsup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s0)));
                dhi = _mm512_mul_ps(dsup, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(s1)));
                mlo = _mm512_setzero_ps();
            } else {
                let (s0, s1) = (sub(0), sub(GROUP));
                dlo = _mm512_mul_ps(dsup, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s0)));
                let m = _mm512_mul_ps(msup, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s1)));
                // Negated by its sign bit, as the 256-bit kernel does (exact).
                mlo = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(m),
                    _mm512_set1_epi32(i32::MIN),
                ));
                dhi = dlo;
            }
            for r in 0..R {
                let y = x.qs[r].add(b * QK);
                let dx = _mm512_set1_ps(*x.d[r].add(b));
                if F == Q6_K {
                    let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
                    let lo = quad_sum(&[v0, v1, v2, v3], y);
                    let hi = quad_sum(&[v4, v5, v6, v7], y.add(16));
                    let [ylo, yhi] = *x.halves[r].add(b);
                    let lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(32 * ylo));
                    let hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(32 * yhi));
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(dlo, dx), acc[r]);
                    acc[r] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(dhi, dx), acc[r]);
                    continue;
                }
                let isum = quad_sum(&v, y);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dlo, dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(mlo, _mm512_set1_ps(*x.s[r].add(b)), acc[r]);
            }
        }
        store(acc)
    }
}

/// One activation row quantised as [`crate::qdot::quantize_block`] does, bit for bit, as
/// `x86::quantize_row` (whose notes on rounding apply), a block in two registers: `vpmovdb`
/// packs the quants and two reductions give the half sums.
///
/// # Safety
/// The CPU must have AVX512-F and -BW; `x` must hold `nb · QK` values.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], mut sums: RowSums) {
    let nb = sums.d.len();
    debug_assert!(x.len() == nb * QK && qs.len() == nb * QK);
    debug_assert!(sums.s.len() == nb && sums.halves.len() == nb);
    // SAFETY: (whole body) block b reads x[b·QK..(b+1)·QK] and writes qs at the same
    // offsets, both in bounds by the contract; the rest is register arithmetic.
    unsafe {
        let sign = _mm512_set1_epi32(i32::MIN);
        let half = _mm512_set1_ps(0.5);
        let one = _mm512_castps_si512(_mm512_set1_ps(1.0));
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let v = [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))];
            let amax =
                _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[0], v[0])
                | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v[1], v[1]);
            let dv = amax / 127.0;
            let id = if dv != 0.0 { 1.0 / dv } else { 0.0 };
            if !id.is_finite() || !amax.is_finite() || nan != 0 {
                super::activations::quantize_block_into(x, b, qs, &mut sums);
                continue;
            }
            let idv = _mm512_set1_ps(id);
            let q = v.map(|v| {
                let y = _mm512_mul_ps(v, idv);
                let t0 = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                let frac = _mm512_abs_ps(_mm512_sub_ps(y, t0));
                let away = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one);
                let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
                let step = _mm512_maskz_mov_ps(ge, _mm512_castsi512_ps(away));
                _mm512_cvttps_epi32(_mm512_add_ps(t0, step))
            });
            let out = qs.as_mut_ptr().add(b * QK) as *mut __m128i;
            _mm_storeu_si128(out, _mm512_cvtepi32_epi8(q[0]));
            _mm_storeu_si128(out.add(1), _mm512_cvtepi32_epi8(q[1]));
            let dr = half::f16::from_f32(dv).to_f32();
            let (lo, hi) = (_mm512_reduce_add_epi32(q[0]), _mm512_reduce_add_epi32(q[1]));
            sums.d[b] = dr;
            sums.s[b] = (lo + hi) as f32 * dr;
            sums.halves[b] = [lo, hi];
        }
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
