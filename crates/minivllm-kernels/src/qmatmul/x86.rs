//! The x86 tiles of [`super::matmul_quant`]: `R` activation rows × one group of weight
//! rows, on AVX2 with the integer sums of [`super::int_dot`]'s instruction sets.

use std::arch::x86_64::*;

use half::f16;

use super::int_dot::{AvxVnni, IntDot, Maddubs};
use super::{Q8Rows, QKernel, QuantMatrix, RowSums, GROUP, KSUB, LANES, SUB_BYTES, VEC_BYTES};
use crate::qdot::QK;
use crate::quant::GgmlType;

/// Where activation rows `i..i + R` of a [`Q8Rows`] (`nb` blocks each) start: their quants,
/// scales, sums and half sums. Made with `wrapping_add`, so making them is safe; the
/// kernels that read through them state why the rows exist.
pub(super) struct XRows<const R: usize> {
    pub(super) qs: [*const i8; R],
    pub(super) d: [*const f32; R],
    pub(super) s: [*const f32; R],
    pub(super) halves: [*const [i32; 2]; R],
}

impl<const R: usize> XRows<R> {
    #[inline(always)]
    pub(super) fn new(x: &Q8Rows, i: usize, nb: usize) -> Self {
        XRows {
            qs: std::array::from_fn(|r| x.qs.as_ptr().wrapping_add((i + r) * nb * QK)),
            d: std::array::from_fn(|r| x.d.as_ptr().wrapping_add((i + r) * nb)),
            s: std::array::from_fn(|r| x.s.as_ptr().wrapping_add((i + r) * nb)),
            halves: std::array::from_fn(|r| x.halves.as_ptr().wrapping_add((i + r) * nb)),
        }
    }
}

/// `out[r][c] = w[t·LANES + c] · x[i + r]`, `t` a half group: lane `c` of each register is
/// weight row `t·LANES + c`. Per block, each activation quad is broadcast against the
/// matching quads of all eight rows, and the block's integer dot product for the eight rows
/// is summed exactly in 32 bits ([`IntDot`]), then scaled once. Every lane's sum runs in
/// block order whatever `R` and whatever `kernel`, so a row's result depends neither on its
/// batch nor on the instruction set. (`QKernel::Avx512Vnni` runs whole groups in
/// `avx512.rs` instead.)
///
/// # Safety
/// The CPU must have what `kernel` names (both include AVX2, FMA and F16C); `w` must have
/// rows `t·LANES..(t + 1)·LANES` (padding included), and rows `i..i + R` of `x` must exist,
/// with the same number of blocks.
#[inline(always)]
pub(super) unsafe fn tile_group<const R: usize>(
    kernel: QKernel,
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    debug_assert!(matches!(kernel, QKernel::Avx2 | QKernel::AvxVnni));
    // SAFETY: (each arm) the caller's contract, which includes the CPU features.
    unsafe {
        match kernel {
            QKernel::AvxVnni => tile_avx_vnni::<R>(w, t, x, i),
            _ => tile_avx2::<R>(w, t, x, i),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2<const R: usize>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    // SAFETY: the caller's contract, forwarded.
    unsafe { tile_of::<R, Maddubs>(w, t, x, i) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn tile_avx_vnni<const R: usize>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    // SAFETY: the caller's contract, forwarded.
    unsafe { tile_of::<R, AvxVnni>(w, t, x, i) }
}

/// [`tile_group`] by format, with `D`'s integer sums.
#[inline(always)]
unsafe fn tile_of<const R: usize, D: IntDot>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    // SAFETY: (each arm) the caller's contract, forwarded.
    unsafe {
        match w.ty {
            GgmlType::Q4_0 => tile_group_nibbles::<R, D, Q4_0>(w, t, x, i),
            GgmlType::Q4_1 => tile_group_nibbles::<R, D, Q4_1>(w, t, x, i),
            GgmlType::Q5_0 => tile_group_nibbles::<R, D, Q5_0>(w, t, x, i),
            GgmlType::Q5_1 => tile_group_nibbles::<R, D, Q5_1>(w, t, x, i),
            GgmlType::Q4_K => tile_group_nibbles::<R, D, Q4_K>(w, t, x, i),
            GgmlType::Q5_K => tile_group_nibbles::<R, D, Q5_K>(w, t, x, i),
            GgmlType::Q6_K => tile_group_nibbles::<R, D, Q6_K>(w, t, x, i),
            _ => tile_group_q8_0::<R, D>(w, t, x, i),
        }
    }
}

// The formats of `tile_group_nibbles` (and of the 512-bit `avx512::tile_nibbles`).
pub(super) const Q4_0: u8 = 0;
pub(super) const Q4_1: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q5_1: u8 = 3;
pub(super) const Q4_K: u8 = 4;
pub(super) const Q5_K: u8 = 5;
pub(super) const Q6_K: u8 = 6;

/// [`tile_group`] for the formats stored as nibbles: 4-, 5- and 6-bit, plain and K-quants.
/// A block's four quant vectors give eight nibble vectors (low nibbles: values `4j..4j + 4`
/// of each row, high nibbles: `16 + 4j..`), with the bits above the nibbles or-ed in from
/// `hbits`; Q4_0 and Q5_0's offsets (-8, -16) and Q4_1 and Q5_1's stored minima apply
/// through the activations' block sums; K-quants' scales `d·sc` are made per block from the
/// super-block's `d` and the 6- or 8-bit `sc` of eight rows.
/// 4-bit products fit 16 bits all eight together (8 · 2 · 15 · 127 = 30,480); wider quants
/// overflow sooner, so the 16-bit sums are widened every 4 (5 bits:
/// 4 · 2 · 31 · 127 = 31,496) or 2 (6 bits: 2 · 2 · 63 · 127 = 32,004) products. Q6_K's
/// halves of 16 have their own scales, so their sums stay apart, and its `-32` offset is
/// taken off each half's integer sum as 32 times the activations' sum over the half: exact,
/// where an offset in floats would cancel most of the sum's bits.
// Index loops: the nibble index `n` selects both a register and an activation quad.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_group_nibbles<const R: usize, D: IntDot, const F: u8>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    const { assert!(F <= Q6_K) };
    let bits = match F {
        Q4_0 | Q4_1 | Q4_K => 4,
        Q6_K => 6,
        _ => 5,
    };
    let per_block = F <= Q5_1;
    let nb = w.nb;
    let block_bytes = GROUP * QK / 2;
    let hb = super::hbits_bytes(w.ty);
    let (g, h) = (t / 2, t % 2);
    let wq =
        w.qs.as_ptr()
            .wrapping_add(g * nb * block_bytes + h * LANES * 4);
    let wsub = w.sub.as_ptr().wrapping_add(g * nb * SUB_BYTES + h * LANES);
    let wh = w.hbits.as_ptr().wrapping_add(g * nb * hb + h * LANES * 4);
    let scales_per_group = if per_block { nb } else { nb / KSUB };
    let at = g * scales_per_group * GROUP + h * LANES;
    let wd = w.d.as_ptr().wrapping_add(at) as *const u16;
    let wm = w.mins.as_ptr().wrapping_add(at) as *const u16;
    let XRows {
        qs: xq,
        d: xd,
        s: xs,
        halves: xh,
    } = XRows::<R>::new(x, i, nb);
    // SAFETY (whole body): group g holds nb blocks of `block_bytes` quants and `hb`
    // high-bit bytes, and `scales_per_group` scales (and minima, for Q5_1, Q4_K and Q5_K)
    // of GROUP rows each, plus SUB_BYTES scale bytes per block for K-quants; activation rows
    // i..i + R hold nb blocks of QK quants and nb scales and sums. The rest is register
    // arithmetic under AVX2/FMA/F16C.
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        let low = _mm256_set1_epi8(0x0F);
        let neg = _mm256_set1_ps(-0.0);
        let mut acc = [_mm256_setzero_ps(); R];
        let (mut dsup, mut msup) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for b in 0..nb {
            if per_block || b % KSUB == 0 {
                let at = if per_block { b } else { b / KSUB } * GROUP;
                dsup = _mm256_cvtph_ps(_mm_loadu_si128(wd.add(at) as *const __m128i));
                if matches!(F, Q4_1 | Q5_1 | Q4_K | Q5_K) {
                    msup = _mm256_cvtph_ps(_mm_loadu_si128(wm.add(at) as *const __m128i));
                }
            }
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
            // The bits above the nibbles are a second stream, as far ahead in blocks.
            prefetch_block(wh.wrapping_add((b + GROUP_PREFETCH / block_bytes) * hb), hb);
            let mut v = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let raw = _mm256_loadu_si256(q.add(j * VEC_BYTES) as *const __m256i);
                v[j] = _mm256_and_si256(raw, low);
                v[4 + j] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
            }
            if bits == 5 {
                // Bit n of each byte to bit 4 of nibble vector n. A 16-bit shift moves no
                // bit across a byte boundary into bit 4 for these distances.
                let h = _mm256_loadu_si256(wh.add(b * hb) as *const __m256i);
                let bit = _mm256_set1_epi8(0x10);
                let or = |v: __m256i, h: __m256i| _mm256_or_si256(v, _mm256_and_si256(h, bit));
                v[0] = or(v[0], _mm256_slli_epi16(h, 4));
                v[1] = or(v[1], _mm256_slli_epi16(h, 3));
                v[2] = or(v[2], _mm256_slli_epi16(h, 2));
                v[3] = or(v[3], _mm256_slli_epi16(h, 1));
                v[4] = or(v[4], h);
                v[5] = or(v[5], _mm256_srli_epi16(h, 1));
                v[6] = or(v[6], _mm256_srli_epi16(h, 2));
                v[7] = or(v[7], _mm256_srli_epi16(h, 3));
            }
            if bits == 6 {
                let top = _mm256_set1_epi8(0x30);
                let or = |v: __m256i, h: __m256i| _mm256_or_si256(v, _mm256_and_si256(h, top));
                for p in 0..2 {
                    let h = _mm256_loadu_si256(wh.add(b * hb + VEC_BYTES * p) as *const __m256i);
                    v[4 * p] = or(v[4 * p], _mm256_slli_epi16(h, 4));
                    v[4 * p + 1] = or(v[4 * p + 1], _mm256_slli_epi16(h, 2));
                    v[4 * p + 2] = or(v[4 * p + 2], h);
                    v[4 * p + 3] = or(v[4 * p + 3], _mm256_srli_epi16(h, 2));
                }
            }
            let s = wsub.wrapping_add(b * SUB_BYTES);
            let sub = |at: usize| _mm_loadl_epi64(s.add(at) as *const __m128i);
            let (dlo, dhi, mlo);
            if F == Q4_0 || F == Q5_0 {
                (dlo, dhi) = (dsup, dsup);
                let offset = if F == Q4_0 { -8.0 } else { -16.0 };
                mlo = _mm256_mul_ps(dsup, _mm256_set1_ps(offset));
            } else if F == Q4_1 || F == Q5_1 {
                (dlo, dhi, mlo) = (dsup, dsup, msup);
            } else if F == Q6_K {
                let (s0, s1) = (sub(0), sub(GROUP));
                dlo = _mm256_mul_ps(dsup, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s0)));
                dhi = _mm256_mul_ps(dsup, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s1)));
                mlo = _mm256_setzero_ps();
            } else {
                let (s0, s1) = (sub(0), sub(GROUP));
                dlo = _mm256_mul_ps(dsup, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s0)));
                let m = _mm256_mul_ps(msup, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(s1)));
                mlo = _mm256_xor_ps(m, neg);
                dhi = dlo;
            }
            for r in 0..R {
                let quads = quads::<8>(xq[r].add(b * QK));
                let dx = _mm256_set1_ps(*xd[r].add(b));
                if bits == 6 {
                    let zero = _mm256_setzero_si256();
                    let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
                    let [y0, y1, y2, y3, y4, y5, y6, y7] = quads;
                    let lo = D::dot::<4, 2>(zero, &[v0, v1, v2, v3], &[y0, y1, y2, y3]);
                    let hi = D::dot::<4, 2>(zero, &[v4, v5, v6, v7], &[y4, y5, y6, y7]);
                    let [ylo, yhi] = *xh[r].add(b);
                    let lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * ylo));
                    let hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * yhi));
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_mul_ps(dlo, dx), acc[r]);
                    acc[r] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_mul_ps(dhi, dx), acc[r]);
                    continue;
                }
                let isum = if bits == 5 {
                    D::dot::<8, 4>(_mm256_setzero_si256(), &v, &quads)
                } else {
                    D::dot::<8, 8>(_mm256_setzero_si256(), &v, &quads)
                };
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dlo, dx), acc[r]);
                acc[r] = _mm256_fmadd_ps(mlo, _mm256_set1_ps(*xs[r].add(b)), acc[r]);
            }
        }
        let mut out = [[0.0; LANES]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}

/// [`tile_group`] for Q8_0. Its quants are signed and span 8 bits, so each product takes
/// `vpmaddubsw`'s sign trick (|q_w| against y signed by q_w) and is widened at once: two
/// pair sums of up to 2 · 128 · 127 would overflow 16 bits. Each block's eight products are
/// summed exactly in 32 bits, then scaled once: every lane in block order whatever `R`.
// Index loops: the quad index `j` selects both a register and an activation offset.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_group_q8_0<const R: usize, D: IntDot>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    let nb = w.nb;
    let block_bytes = GROUP * QK;
    let (g, h) = (t / 2, t % 2);
    let wq =
        w.qs.as_ptr()
            .wrapping_add(g * nb * block_bytes + h * LANES * 4);
    let wd = w.d.as_ptr().wrapping_add(g * nb * GROUP + h * LANES) as *const u16;
    let XRows { qs: xq, d: xd, .. } = XRows::<R>::new(x, i, nb);
    // SAFETY (whole body): group g holds nb blocks of `block_bytes` quants and GROUP scales
    // each; activation rows i..i + R hold nb blocks of QK quants and nb scales. The rest is
    // register arithmetic under AVX2/FMA/F16C.
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(Q8_0_PREFETCH), block_bytes);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd.add(b * GROUP) as *const __m128i));
            let mut isum = [_mm256_setzero_si256(); R];
            // Two halves of four vectors: eight quant vectors and their absolute values
            // would take every register.
            for half in 0..2 {
                let mut v = [_mm256_setzero_si256(); 4];
                let mut u = [_mm256_setzero_si256(); 4];
                for j in 0..4 {
                    let at = (4 * half + j) * VEC_BYTES;
                    v[j] = _mm256_loadu_si256(q.add(at) as *const __m256i);
                    u[j] = _mm256_sign_epi8(v[j], v[j]);
                }
                for r in 0..R {
                    let quads = quads::<4>(xq[r].add(b * QK + 16 * half));
                    let y = std::array::from_fn(|j| _mm256_sign_epi8(quads[j], v[j]));
                    isum[r] = D::dot::<4, 1>(isum[r], &u, &y);
                }
            }
            for r in 0..R {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*xd[r].add(b)));
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
            }
        }
        let mut out = [[0.0; LANES]; R];
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr(), acc[r]);
        }
        out
    }
}

/// Asks for the `bytes` (a multiple of 64) from `p` on, one cache line at a time.
#[inline(always)]
pub(super) fn prefetch_block(p: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is
        // part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8) };
    }
}

/// The `N` activation quads (4 bytes each) from `y` on, each broadcast to every lane.
///
/// # Safety
/// `y` must point to `4 N` readable bytes; the caller has AVX.
#[inline(always)]
unsafe fn quads<const N: usize>(y: *const i8) -> [__m256i; N] {
    let y = y as *const i32;
    // SAFETY: the caller's contract.
    std::array::from_fn(|t| unsafe { _mm256_set1_epi32(std::ptr::read_unaligned(y.add(t))) })
}

/// How far ahead of the current block a Q8_0 group's quants are prefetched, in bytes (4
/// blocks).
pub(super) const Q8_0_PREFETCH: usize = 4 * GROUP * QK;

/// How far ahead of the current block a group's quants are prefetched, in bytes (8 blocks).
/// Every cache line of a block is asked for: one prefetch per block of two lines measured
/// 25-40 % slower one-sequence decode on an AVX2 EPYC (the hardware prefetcher alone does
/// not keep enough loads in flight, most of all on one thread); twice as far ahead was no
/// better.
pub(super) const GROUP_PREFETCH: usize = 8 * GROUP * QK / 2;

/// One activation row quantised as [`crate::qdot::quantize_block`] does, bit for bit: the
/// same `amax / 127` scale and its reciprocal, the same products, and `roundf`'s ties away
/// from zero (not the vector unit's ties to even, which ggml's own AVX2 path uses), so that
/// every ISA feeds the dot products the same quants. Writes `qs` (`nb · QK`) and `sums`
/// (`nb` each).
///
/// # Safety
/// The CPU must have AVX2 and FMA; `x` must hold `nb · QK` values.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn quantize_row(x: &[f32], qs: &mut [i8], mut sums: RowSums) {
    let nb = sums.d.len();
    debug_assert!(x.len() == nb * QK && qs.len() == nb * QK);
    debug_assert!(sums.s.len() == nb && sums.halves.len() == nb);
    // SAFETY (whole body): block b reads x[b·QK..(b+1)·QK] and writes qs at the same
    // offsets, both in bounds by the contract; the rest is register arithmetic under AVX2.
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for b in 0..nb {
            let p = x.as_ptr().add(b * QK);
            let v: [__m256; 4] = std::array::from_fn(|t| _mm256_loadu_ps(p.add(8 * t)));
            let mut amax = _mm256_andnot_ps(sign, v[0]);
            for vt in &v[1..] {
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, *vt));
            }
            let nan = v.iter().fold(_mm256_setzero_ps(), |n, vt| {
                _mm256_or_ps(n, _mm256_cmp_ps::<_CMP_UNORD_Q>(*vt, *vt))
            });
            let amax = hmax(amax);
            let dv = amax / 127.0;
            let id = if dv != 0.0 { 1.0 / dv } else { 0.0 };
            if !id.is_finite() || !amax.is_finite() || _mm256_movemask_ps(nan) != 0 {
                // Subnormal scales and non-finite inputs: the conversions below saturate
                // differently from Rust's casts, so such blocks take the scalar path.
                super::activations::quantize_block_into(x, b, qs, &mut sums);
                continue;
            }
            let idv = _mm256_set1_ps(id);
            let q: [__m256i; 4] = std::array::from_fn(|t| {
                let y = _mm256_mul_ps(v[t], idv);
                // roundf: truncate, then step away from zero when the dropped part is at
                // least a half (both steps exact for |y| < 2^23).
                let t0 = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(y, t0));
                let away = _mm256_or_ps(_mm256_and_ps(y, sign), one);
                let step = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), away);
                _mm256_cvttps_epi32(_mm256_add_ps(t0, step))
            });
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let packed = _mm256_permutevar8x32_epi32(packed, order);
            _mm256_storeu_si256(qs.as_mut_ptr().add(b * QK) as *mut __m256i, packed);
            let dr = f16::from_f32(dv).to_f32();
            sums.d[b] = dr;
            sums.s[b] = hsum_i32(sum) as f32 * dr;
            let low = hsum_i32(_mm256_add_epi32(q[0], q[1]));
            sums.halves[b] = [low, hsum_i32(sum) - low];
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
