//! The 256-bit tiles: half a group of weight rows (eight lanes) on AVX2, with FMA and F16C,
//! the integer sums by `vpmaddubsw` or by AVX-VNNI's `vpdpbusd` ([`IntDot`]).

use std::arch::x86_64::*;
use std::marker::PhantomData;

use half::f16;

use super::{prefetch_block, tile_units, Width, XRows, Q8_0_PREFETCH};
use crate::quant::activations::Q8Rows;
use crate::quant::formats::QK;
use crate::quant::kernel::QKernel;
use crate::quant::layout::{QuantMatrix, GROUP, LANES, VEC_BYTES};

/// `out[r][c] = w[t·LANES + c] · x[i + r]`, `t` a half group (see [`super::tile`]), the
/// integer sums by `kernel`'s instructions. (`QKernel::Avx512Vnni` runs whole groups in
/// [`super::avx512`] instead.)
///
/// # Safety
/// The CPU must have what `kernel` names (both include AVX2, FMA and F16C); `w` must have
/// rows `t·LANES..(t + 1)·LANES` (padding included), and rows `i..i + R` of `x` must exist,
/// with the same number of blocks.
#[inline(always)]
pub(in crate::quant) unsafe fn tile_group<const R: usize>(
    kernel: QKernel,
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[f32; LANES]; R] {
    // SAFETY: the caller's contract, forwarded.
    let [out] = unsafe { units::<R, 1>(kernel, w, t, x, i) };
    out
}

/// [`tile_group`] for both halves of group `g` in one pass (see [`super::tile_units`]):
/// `out[k]` holds half `2g + k`'s.
///
/// # Safety
/// [`tile_group`]'s contract for half groups `2g` and `2g + 1`.
#[inline(always)]
pub(in crate::quant) unsafe fn tile_pair<const R: usize>(
    kernel: QKernel,
    w: &QuantMatrix,
    g: usize,
    x: &Q8Rows,
    i: usize,
) -> [[[f32; LANES]; R]; 2] {
    // SAFETY: the caller's contract, forwarded.
    unsafe { units::<R, 2>(kernel, w, 2 * g, x, i) }
}

/// [`super::tile_units`] of half groups `t..t + U` by `kernel`'s instructions.
///
/// # Safety
/// [`tile_group`]'s contract for each half group `t..t + U`, all in one group.
#[inline(always)]
unsafe fn units<const R: usize, const U: usize>(
    kernel: QKernel,
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[[f32; LANES]; R]; U] {
    debug_assert!(matches!(kernel, QKernel::Avx2 | QKernel::AvxVnni));
    // SAFETY: (each arm) the caller's contract, which includes the CPU features.
    unsafe {
        match kernel {
            QKernel::AvxVnni => units_avx_vnni::<R, U>(w, t, x, i),
            _ => units_avx2::<R, U>(w, t, x, i),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn units_avx2<const R: usize, const U: usize>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[[f32; LANES]; R]; U] {
    // SAFETY: the caller's contract, forwarded; this function enables Ymm<Maddubs>'s
    // features.
    unsafe { tile_units::<R, U, Ymm<Maddubs>>(w, t, x, i) }
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn units_avx_vnni<const R: usize, const U: usize>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[[f32; LANES]; R]; U] {
    // SAFETY: the caller's contract, forwarded; this function enables Ymm<AvxVnni>'s
    // features.
    unsafe { tile_units::<R, U, Ymm<AvxVnni>>(w, t, x, i) }
}

/// 256-bit registers, the integer sums by `D`: AVX2, FMA and F16C, and what `D` names.
pub(in crate::quant) struct Ymm<D>(PhantomData<D>);

// SAFETY (every method): register-only intrinsics, or loads from what the trait's contract
// makes readable, under the features the implementation names.
impl<D: IntDot> Width for Ymm<D> {
    const ROWS: usize = LANES;
    type I = __m256i;
    type F = __m256;
    type Out = [f32; LANES];

    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat_i8(v: i8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_epi8(v) }
    }
    #[inline(always)]
    unsafe fn splat_i32(v: i32) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_loadu_si256(p as *const __m256i) }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn table(t: &[u8; 16]) -> __m256i {
        // SAFETY: see the impl; `t` is 16 readable bytes.
        unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn lookup(table: __m256i, v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_shuffle_epi8(table, v) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn shl16<const N: i32>(v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_slli_epi16::<N>(v) }
    }
    #[inline(always)]
    unsafe fn shr16<const N: i32>(v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_srli_epi16::<N>(v) }
    }
    #[inline(always)]
    unsafe fn shl32<const N: i32>(v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_slli_epi32::<N>(v) }
    }
    #[inline(always)]
    unsafe fn shr32<const N: i32>(v: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_srli_epi32::<N>(v) }
    }
    #[inline(always)]
    unsafe fn cvt(v: __m256i) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtepi32_ps(v) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn neg(a: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_xor_ps(a, _mm256_set1_ps(-0.0)) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn scales(p: *const f16) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn bytes_i8(p: *const u8) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i))) }
    }
    #[inline(always)]
    unsafe fn bytes_u32(p: *const u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn bytes_i32(p: *const u8) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i)) }
    }
    #[inline(always)]
    unsafe fn quad_dot<const N: usize, const CHUNK: usize>(
        init: __m256i,
        v: &[__m256i; N],
        y: *const i8,
    ) -> __m256i {
        // SAFETY: see the impl.
        unsafe { D::dot::<N, CHUNK>(init, v, &quads::<N>(y)) }
    }
    #[inline(always)]
    unsafe fn add32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul32(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn pack16(lo: __m256i, hi: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_blend_epi16::<0xAA>(lo, _mm256_slli_epi32::<16>(hi)) }
    }
    #[inline(always)]
    unsafe fn madd16(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { _mm256_madd_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn scale_operand(sc: __m256i) -> __m256i {
        // SAFETY: see the impl.
        unsafe { D::scale_operand(sc) }
    }
    #[inline(always)]
    unsafe fn quad_dot_scaled<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        sc: __m256i,
        v: &[__m256i; N],
        y: *const i8,
    ) -> __m256i {
        // SAFETY: see the impl.
        unsafe { D::dot_scaled::<N, CHUNK>(acc, sc, v, &quads::<N>(y)) }
    }
    #[inline(always)]
    unsafe fn store(v: __m256) -> [f32; LANES] {
        let mut out = [0.0; LANES];
        // SAFETY: see the impl; `out` holds LANES = 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    }
    #[inline(always)]
    unsafe fn tile_q8_0<const R: usize, const U: usize>(
        w: &QuantMatrix,
        t: usize,
        x: &Q8Rows,
        i: usize,
    ) -> [[[f32; LANES]; R]; U] {
        // SAFETY: the trait's contract, forwarded.
        unsafe { tile_q8_0::<R, U, D>(w, t, x, i) }
    }
}

/// [`super::tile`] for Q8_0. Its quants are signed and span 8 bits, so each product takes
/// `vpmaddubsw`'s sign trick (|q_w| against y signed by q_w) and is widened at once: two
/// pair sums of up to 2 · 128 · 127 would overflow 16 bits. Each block's eight products are
/// summed exactly in 32 bits, then scaled once: every lane in block order whatever `R`.
// Index loops: the quad index `j` selects both a register and an activation offset.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_q8_0<const R: usize, const U: usize, D: IntDot>(
    w: &QuantMatrix,
    t: usize,
    x: &Q8Rows,
    i: usize,
) -> [[[f32; LANES]; R]; U] {
    let nb = w.nb;
    let block_bytes = GROUP * QK;
    let (g, h) = (t / 2, t % 2);
    let wq =
        w.qs.as_ptr()
            .wrapping_add(g * nb * block_bytes + h * LANES * 4);
    let wd = w.d.as_ptr().wrapping_add(g * nb * GROUP + h * LANES) as *const u16;
    let XRows { qs: xq, d: xd, .. } = XRows::<R>::new(x, i, nb);
    // SAFETY (whole body): group g holds nb blocks of `block_bytes` quants and GROUP scales
    // each, the units' h·LANES..(h + U)·LANES rows among them; activation rows i..i + R hold
    // nb blocks of QK quants and nb scales. The rest is register arithmetic under
    // AVX2/FMA/F16C.
    // SAFETY: the caller's contract, forwarded.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); R]; U];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(Q8_0_PREFETCH), block_bytes);
            for k in 0..U {
                let (q, lane) = (q.add(k * LANES * 4), b * GROUP + k * LANES);
                let dw = _mm256_cvtph_ps(_mm_loadu_si128(wd.add(lane) as *const __m128i));
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
                    acc[k][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[k][r]);
                }
            }
        }
        let mut out = [[[0.0; LANES]; R]; U];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = super::store_rows::<R, Ymm<D>>(a);
        }
        out
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

/// The integer core of the 256-bit tiles: exact 32-bit sums of byte products, one per lane.
/// This is the only step that differs between AVX2 and AVX-VNNI: AVX2 multiplies byte
/// pairs with `vpmaddubsw` into 16 bits and widens with `vpmaddwd`; VNNI fuses all of it
/// into one `vpdpbusd` per vector (as the 512-bit tiles do). The sums are exact in every
/// case, so every ISA gives the tiles the same integers, and the same bits.
/// `acc + Σ_t Σ_e u[t]_e · s[t]_e` per 32-bit lane, `e` over the lane's four bytes, `u`
/// unsigned and `s` signed.
pub(in crate::quant) trait IntDot {
    /// `CHUNK` is how many `vpmaddubsw` products may be summed in 16 bits before they
    /// must be widened, which the operands' range decides (ignored where sums are 32-bit).
    ///
    /// # Safety
    /// The CPU must have the instruction set the implementation names.
    unsafe fn dot<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i;

    /// Per-lane scales (-128 to 127 in each 32-bit lane) in the form [`IntDot::dot_scaled`]
    /// takes.
    ///
    /// # Safety
    /// As [`IntDot::dot`].
    unsafe fn scale_operand(sc: __m256i) -> __m256i;

    /// `acc + sc · (Σ_t Σ_e u[t]_e · s[t]_e)` per 32-bit lane, exact, `sc` from
    /// [`IntDot::scale_operand`].
    ///
    /// # Safety
    /// As [`IntDot::dot`].
    unsafe fn dot_scaled<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        sc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i;
}

/// AVX2: `vpmaddubsw` pair sums, `CHUNK` of them added in 16 bits, widened by `vpmaddwd`.
pub(in crate::quant) struct Maddubs;

impl IntDot for Maddubs {
    #[inline(always)]
    unsafe fn dot<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i {
        // SAFETY: the caller has AVX2; a scale of one is the plain widening.
        unsafe { Self::dot_scaled::<N, CHUNK>(acc, _mm256_set1_epi16(1), u, s) }
    }

    /// The scale in both 16-bit halves of its lane: `vpmaddwd` by it then scales both
    /// pair sums as it widens them. (A blend, not an or: a negative scale's top half is
    /// all ones.)
    #[inline(always)]
    unsafe fn scale_operand(sc: __m256i) -> __m256i {
        // SAFETY: register-only AVX2 intrinsics; the caller has AVX2.
        unsafe { _mm256_blend_epi16::<0xAA>(sc, _mm256_slli_epi32::<16>(sc)) }
    }

    #[inline(always)]
    unsafe fn dot_scaled<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        sc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i {
        const { assert!(CHUNK > 0) };
        // SAFETY: register-only AVX2 intrinsics; the caller has AVX2.
        unsafe {
            let mut acc = acc;
            for c in (0..N).step_by(CHUNK) {
                let mut s16 = _mm256_maddubs_epi16(u[c], s[c]);
                for t in c + 1..(c + CHUNK).min(N) {
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[t], s[t]));
                }
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s16, sc));
            }
            acc
        }
    }
}

/// AVX-VNNI (VEX-encoded `vpdpbusd`: Intel since Alder Lake, AMD since Zen 5).
pub(in crate::quant) struct AvxVnni;

impl IntDot for AvxVnni {
    #[inline(always)]
    unsafe fn dot<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i {
        let mut acc = acc;
        for t in 0..N {
            // SAFETY: a register-only intrinsic; the caller has AVX-VNNI.
            acc = unsafe { _mm256_dpbusd_avx_epi32(acc, u[t], s[t]) };
        }
        acc
    }

    #[inline(always)]
    unsafe fn scale_operand(sc: __m256i) -> __m256i {
        sc
    }

    /// `vpdpbusd`'s 32-bit sum times the scale (`vpmulld`).
    #[inline(always)]
    unsafe fn dot_scaled<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        sc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i {
        // SAFETY: register-only intrinsics; the caller has AVX-VNNI (and AVX2).
        unsafe {
            let sum = Self::dot::<N, CHUNK>(_mm256_setzero_si256(), u, s);
            _mm256_add_epi32(acc, _mm256_mullo_epi32(sum, sc))
        }
    }
}
