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

use half::f16;

use super::{prefetch_block, tile, unpack_block, Width, XRows, GROUP_PREFETCH, Q8_0_PREFETCH};
use crate::quant::activations::Q8Rows;
use crate::quant::formats::{self, GgmlType, QK};
use crate::quant::layout::{hbits_bytes, sub_bytes, QuantMatrix, GROUP, KSUB, VEC_BYTES};

/// `out[r][c] = w[g·GROUP + c] · x[i + r]` (see [`super::tile`]).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX512-F, -BW and -VNNI; `w` must have group `g`, and
/// rows `i..i + R` of `x` must exist, with the same number of blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(in crate::quant) unsafe fn tile_group<const R: usize>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    // SAFETY: the caller's contract, forwarded; this function enables Zmm's features.
    unsafe {
        if x.unsigned {
            return tile_q6_k_unsigned::<R>(w, g, x, i);
        }
        tile::<R, Zmm>(w, g, x, i)
    }
}

/// 512-bit registers: AVX512-F, -BW and -VNNI, with AVX2, FMA and F16C.
pub(in crate::quant) struct Zmm;

// SAFETY (every method): register-only intrinsics, or loads from what the trait's contract
// makes readable, under the features the implementation names.
impl Width for Zmm {
    const ROWS: usize = GROUP;
    type I = __m512i;
    type F = __m512;
    type Out = [f32; GROUP];

    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat_i8(v: i8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat_i32(v: i32) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn table(t: &[u8; 16]) -> __m512i {
        // SAFETY: see the impl; `t` is 16 readable bytes.
        unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn lookup(table: __m512i, v: __m512i) -> __m512i {
        // SAFETY: see the impl (AVX512BW).
        unsafe { _mm512_shuffle_epi8(table, v) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn shl16<const N: i32>(v: __m512i) -> __m512i {
        // The 512-bit shifts take their immediate as u32: one arm per distance the tiles
        // use, folded away at compile time.
        // SAFETY: see the impl.
        unsafe {
            match N {
                1 => _mm512_slli_epi16::<1>(v),
                2 => _mm512_slli_epi16::<2>(v),
                3 => _mm512_slli_epi16::<3>(v),
                4 => _mm512_slli_epi16::<4>(v),
                _ => unreachable!("shift by {N}"),
            }
        }
    }
    #[inline(always)]
    unsafe fn shr16<const N: i32>(v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            match N {
                1 => _mm512_srli_epi16::<1>(v),
                2 => _mm512_srli_epi16::<2>(v),
                3 => _mm512_srli_epi16::<3>(v),
                4 => _mm512_srli_epi16::<4>(v),
                _ => unreachable!("shift by {N}"),
            }
        }
    }
    #[inline(always)]
    unsafe fn shl32<const N: i32>(v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            match N {
                2 => _mm512_slli_epi32::<2>(v),
                4 => _mm512_slli_epi32::<4>(v),
                6 => _mm512_slli_epi32::<6>(v),
                16 => _mm512_slli_epi32::<16>(v),
                _ => unreachable!("shift by {N}"),
            }
        }
    }
    #[inline(always)]
    unsafe fn shr32<const N: i32>(v: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            match N {
                2 => _mm512_srli_epi32::<2>(v),
                4 => _mm512_srli_epi32::<4>(v),
                6 => _mm512_srli_epi32::<6>(v),
                _ => unreachable!("shift by {N}"),
            }
        }
    }
    #[inline(always)]
    unsafe fn cvt(v: __m512i) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn neg(a: __m512) -> __m512 {
        // By the integer xor: `_mm512_xor_ps` needs AVX512-DQ.
        // SAFETY: see the impl.
        unsafe {
            _mm512_castsi512_ps(_mm512_xor_si512(
                _mm512_castps_si512(a),
                _mm512_set1_epi32(i32::MIN),
            ))
        }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const f16) -> __m512 {
        // SAFETY: see the impl.
        unsafe { scales(p) }
    }
    #[inline(always)]
    unsafe fn bytes_i8(p: *const u8) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn bytes_u32(p: *const u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn bytes_i32(p: *const u8) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const __m128i)) }
    }
    /// `vpdpbusd` sums in 32 bits: `CHUNK` does not apply.
    #[inline(always)]
    unsafe fn quad_dot<const N: usize, const CHUNK: usize>(
        init: __m512i,
        v: &[__m512i; N],
        y: *const i8,
    ) -> __m512i {
        // SAFETY: see the impl.
        unsafe { quad_sum(init, v, y) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn pack16(lo: __m512i, hi: __m512i) -> __m512i {
        // SAFETY: see the impl (AVX512-BW for the 16-bit blend).
        unsafe { _mm512_mask_blend_epi16(0xAAAA_AAAA, lo, _mm512_slli_epi32::<16>(hi)) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: see the impl.
        unsafe { _mm512_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn scale_operand(sc: __m512i) -> __m512i {
        sc
    }
    /// `vpdpbusd`'s 32-bit sum times the scale (`vpmulld`).
    #[inline(always)]
    unsafe fn quad_dot_scaled<const N: usize, const CHUNK: usize>(
        acc: __m512i,
        sc: __m512i,
        v: &[__m512i; N],
        y: *const i8,
    ) -> __m512i {
        // SAFETY: see the impl.
        unsafe {
            let sum = quad_sum(_mm512_setzero_si512(), v, y);
            _mm512_add_epi32(acc, _mm512_mullo_epi32(sum, sc))
        }
    }
    /// Where the quants are 4-bit (`CHUNK` 8), each half block's sum, 16 products, fits 16
    /// bits (16 · 15 · 128), so the two halves pack into one lane's 16-bit pair and
    /// `vpdpwssd` scales and adds both: the same exact sum in place of `vpmulld` and
    /// `vpaddd` (Q4_K at 64 and 512 rows 1.024x and 1.029x on a Zen 4 EPYC).
    #[inline(always)]
    unsafe fn quad_dot_scaled_rows<const R: usize, const N: usize, const CHUNK: usize>(
        acc: &mut [__m512i; R],
        sc: __m512i,
        v: &[__m512i; N],
        y: &[*const i8; R],
    ) {
        // SAFETY: see the impl; each y[r] has 4 N readable bytes (the caller's contract).
        unsafe {
            if N != 8 || CHUNK != 8 {
                return super::each_row_scaled::<R, N, CHUNK, Self>(acc, sc, v, y);
            }
            // The scale in both 16-bit halves: a blend, so a negative one stays itself.
            let sc2 = Self::pack16(sc, sc);
            for r in 0..R {
                let q = y[r] as *const i32;
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for n in 0..N / 2 {
                    let (ql, qh) = (q.add(n).read_unaligned(), q.add(n + N / 2).read_unaligned());
                    lo = _mm512_dpbusd_epi32(lo, v[n], _mm512_set1_epi32(ql));
                    hi = _mm512_dpbusd_epi32(hi, v[n + N / 2], _mm512_set1_epi32(qh));
                }
                acc[r] = _mm512_dpwssd_epi32(acc[r], Self::pack16(lo, hi), sc2);
            }
        }
    }
    #[inline(always)]
    unsafe fn store(v: __m512) -> [f32; GROUP] {
        let mut out = [0.0; GROUP];
        // SAFETY: see the impl; `out` holds GROUP = 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    }
    #[inline(always)]
    unsafe fn tile_q8_0<const R: usize, const U: usize>(
        w: &QuantMatrix,
        g: usize,
        x: &Q8Rows,
        i: usize,
    ) -> [[[f32; GROUP]; R]; U] {
        const { assert!(U == 1, "a 512-bit unit is a whole group") };
        // SAFETY: the trait's contract, forwarded.
        [unsafe { tile_q8_0::<R>(w, g, x, i) }; U]
    }
}

// Index loops: the nibble index selects a register; `r` an accumulator and a row.
#[allow(clippy::needless_range_loop)]
/// Q6_K against activations made unsigned (`Q8Rows::make_unsigned`: `a + 128`), its own
/// quants less 32 as the signed operand: `Σ (q - 32) · (a + 128)` is the wanted
/// `Σ (q - 32) · a` plus 128 times a sum of the weights alone, which each super-block's
/// sums start below (`QuantMatrix::q6_offsets`). The generic tile instead takes, per row
/// and block, `-32 · sc_h · Σ a` over each half (a broadcast, a `vpmaddwd` and a `vpaddd`
/// beside the eight `vpdpbusd`); here the activations are `vpdpbusd`'s unsigned operand,
/// which has no embedded broadcast, so each quad is broadcast from memory on its own (a
/// load, no vector op, on Zen 4). Integer sums are exact either way, so the results are
/// the generic tile's bit for bit (and where it runs: `matmul::Q6_UNSIGNED_MIN_ROWS`).
///
/// # Safety
/// [`tile_group`]'s contract, `w` Q6_K with shared activation scales and `x` unsigned.
#[inline(always)]
unsafe fn tile_q6_k_unsigned<const R: usize>(
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; R] {
    debug_assert!(w.ty == GgmlType::Q6_K && !w.block_activations && x.unsigned);
    let nb = w.nb;
    let block_bytes = GROUP * QK / 2;
    let (hb, sub_step) = (hbits_bytes(w.ty), sub_bytes(w.ty));
    let wq = w.qs.as_ptr().wrapping_add(g * nb * block_bytes);
    let wsub = w.sub.as_ptr().wrapping_add(g * nb * sub_step);
    let wh = w.hbits.as_ptr().wrapping_add(g * nb * hb);
    let at = g * (nb / KSUB) * GROUP;
    let (wd, wo) = (
        w.d.as_ptr().wrapping_add(at),
        w.q6_offsets.as_ptr().wrapping_add(at),
    );
    let x = XRows::<R>::new(x, i, nb);
    // SAFETY: (whole body) group g holds nb blocks of `block_bytes` quants, `hb` high-bit
    // bytes and `sub_step` scale bytes, and nb / KSUB super-blocks of GROUP scales and
    // offsets; activation rows i..i + R hold nb blocks of QK quants and scales. The rest is
    // register arithmetic under the contract's features.
    unsafe {
        let bias = _mm512_set1_epi8(32);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut sums = [_mm512_setzero_si512(); R];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
            prefetch_block(wh.wrapping_add((b + GROUP_PREFETCH / block_bytes) * hb), hb);
            if b % KSUB == 0 {
                let offset = _mm512_loadu_si512(wo.add(b / KSUB * GROUP) as *const __m512i);
                let start = _mm512_sub_epi32(_mm512_setzero_si512(), offset);
                sums = [start; R];
            }
            let mut v = unpack_block::<Zmm, formats::Q6_K_Shared>(q, wh.add(b * hb));
            for n in &mut v {
                *n = _mm512_sub_epi8(*n, bias);
            }
            let sub = wsub.add(b * sub_step);
            let (slo, shi) = (Zmm::bytes_i32(sub), Zmm::bytes_i32(sub.add(GROUP)));
            for_each_row!(R, r, {
                let y = x.qs[r].add(b * QK) as *const i32;
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for n in 0..4 {
                    let (ql, qh) = (y.add(n).read_unaligned(), y.add(n + 4).read_unaligned());
                    lo = _mm512_dpbusd_epi32(lo, _mm512_set1_epi32(ql), v[n]);
                    hi = _mm512_dpbusd_epi32(hi, _mm512_set1_epi32(qh), v[n + 4]);
                }
                let scaled =
                    _mm512_add_epi32(_mm512_mullo_epi32(lo, slo), _mm512_mullo_epi32(hi, shi));
                sums[r] = _mm512_add_epi32(sums[r], scaled);
            });
            if b % KSUB == KSUB - 1 {
                let (b0, dw) = (b + 1 - KSUB, scales(wd.add(b / KSUB * GROUP)));
                for_each_row!(R, r, {
                    let dx = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[r].add(b0)));
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]), dx, acc[r]);
                });
            }
        }
        super::store_rows::<R, Zmm>(acc)
    }
}

/// `init + Σ_n w[n] · quad n of y` over `N` quads, exact, one weight row per lane.
///
/// # Safety
/// `y` must point to `4 N` readable bytes; the caller has AVX512-VNNI.
#[inline(always)]
unsafe fn quad_sum<const N: usize>(init: __m512i, w: &[__m512i; N], y: *const i8) -> __m512i {
    let y = y as *const i32;
    // SAFETY: the caller's contract.
    unsafe {
        let mut acc = init;
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
unsafe fn scales(p: *const f16) -> __m512 {
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
                // -128 Σ y: four times the two halves' Q6_K offsets.
                let [lo, hi] = *x.offsets[r].add(b);
                let offset = _mm512_set1_epi32(4 * (lo + hi));
                let isum = quad_sum(offset, &v, x.qs[r].add(b * QK));
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*x.d[r].add(b)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
            }
        }
        super::store_rows::<R, Zmm>(acc)
    }
}
