//! The x86-64 tokens (`Avx2`, `Avx512`) and their [`Simd`] operations.

use super::Simd;
use half::{bf16, f16};
use std::arch::x86_64::*;

/// A vector read or written at any alignment.
///
/// `_mm256_loadu_ps` and friends go through `ptr::copy_nonoverlapping`, whose debug
/// precondition checks (dev builds keep debug assertions) cost more than the FMA they
/// feed; a packed-struct access is the same `vmovups` with nothing around it.
#[repr(C, packed)]
struct Unaligned<T>(T);

/// # Safety
/// `p` must be valid for reading a `T`, at any alignment.
#[inline(always)]
unsafe fn load_unaligned<T: Copy>(p: *const f32) -> T {
    // SAFETY: the caller's; `Unaligned` has alignment 1.
    unsafe { (*p.cast::<Unaligned<T>>()).0 }
}

/// # Safety
/// `p` must be valid for writing a `T`, at any alignment.
#[inline(always)]
unsafe fn store_unaligned<T: Copy>(p: *mut f32, v: T) {
    // SAFETY: the caller's; `Unaligned` has alignment 1.
    unsafe { *p.cast::<Unaligned<T>>() = Unaligned(v) }
}

// Cephes' expf: e^x = 2^n · e^r with |r| <= ln2/2, e^r by a degree-6 polynomial.
const EXP_HI: f32 = 88.376_26;
const EXP_LO: f32 = -88.376_26;
const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split in two so that `x - n·ln2` is exact for the n that occur.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// The [`Simd`] methods both x86 tokens implement the same way (both imply AVX2).
macro_rules! shared_x86_methods {
    () => {
        #[inline(always)]
        unsafe fn transpose8(
            self,
            src: *const f32,
            src_stride: usize,
            dst: *mut f32,
            dst_stride: usize,
        ) {
            // SAFETY: the caller's; AVX is implied by this token.
            unsafe { transpose8_avx(src, src_stride, dst, dst_stride) }
        }
        #[inline(always)]
        fn prefetch(self, p: *const f32) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
        }
    };
}

/// AVX2 8 × 8 transpose (unpack, shuffle, then swap 128-bit halves).
///
/// # Safety
/// As [`Simd::transpose8`], on a CPU with AVX.
#[inline(always)]
unsafe fn transpose8_avx(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
    // SAFETY: the caller's.
    unsafe {
        let mut r = [_mm256_setzero_ps(); 8];
        for (i, r) in r.iter_mut().enumerate() {
            *r = load_unaligned(src.wrapping_add(i * src_stride));
        }
        let t: [__m256; 8] = [
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        ];
        let u: [__m256; 8] = [
            _mm256_shuffle_ps::<0x44>(t[0], t[2]),
            _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
            _mm256_shuffle_ps::<0x44>(t[1], t[3]),
            _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
            _mm256_shuffle_ps::<0x44>(t[4], t[6]),
            _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
            _mm256_shuffle_ps::<0x44>(t[5], t[7]),
            _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
        ];
        for q in 0..4 {
            let lo = _mm256_permute2f128_ps::<0x20>(u[q], u[q + 4]);
            let hi = _mm256_permute2f128_ps::<0x31>(u[q], u[q + 4]);
            store_unaligned(dst.wrapping_add(q * dst_stride), lo);
            store_unaligned(dst.wrapping_add((q + 4) * dst_stride), hi);
        }
    }
}

/// Proof that AVX2, FMA and F16C are available.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// # Safety
    /// The CPU must support `avx2`, `fma` and `f16c`.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx2(())
    }

    /// The token where the CPU has AVX2, for tests; says which test ran or skipped it.
    #[cfg(test)]
    pub(crate) fn new() -> Option<Self> {
        tested_isa(crate::cpu::Isa::Avx2).then_some(Avx2(()))
    }
}

// SAFETY (for every `unsafe` block in this impl): an `Avx2` exists only where avx2, f16c and
// fma are available, so the intrinsics are supported; pointer validity is the caller's.
impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    shared_x86_methods!();
    #[inline(always)]
    fn zero(self) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { load_unaligned(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { store_unaligned(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_cvtph_ps(load_unaligned(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m256 {
        // bf16 is the top half of an f32.
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let h: __m128i = load_unaligned(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn hsum(self, v: __m256) -> f32 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn hsum4(self, v: [__m256; 4]) -> [f32; 4] {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            // Pairwise adds leave lane sums of a, b, c, d in each 128-bit half.
            let ab = _mm256_hadd_ps(v[0], v[1]);
            let cd = _mm256_hadd_ps(v[2], v[3]);
            let abcd = _mm256_hadd_ps(ab, cd);
            let sum = _mm_add_ps(
                _mm256_castps256_ps128(abcd),
                _mm256_extractf128_ps::<1>(abcd),
            );
            std::mem::transmute::<__m128, [f32; 4]>(sum)
        }
    }
    #[inline(always)]
    fn hmax(self, v: __m256) -> f32 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn exp(self, x: __m256) -> __m256 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
                _mm256_set1_ps(EXP_HI),
            );
            let n = _mm256_round_ps(
                _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
            let mut p = _mm256_set1_ps(EXP_P[0]);
            for &c in &EXP_P[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
            }
            let p = _mm256_fmadd_ps(
                p,
                _mm256_mul_ps(r, r),
                _mm256_add_ps(r, _mm256_set1_ps(1.0)),
            );
            // 2^n through the exponent field; n is in [-127, 127], so n + 127 never overflows.
            let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
                23,
            ));
            _mm256_mul_ps(p, pow2n)
        }
    }
}

/// Whether a test can run `isa`'s kernels here, printed either way (`RAN`/`SKIPPED`,
/// with the test's name) so that a machine without the ISA shows what it did not test
/// instead of passing silently.
#[cfg(test)]
fn tested_isa(isa: crate::cpu::Isa) -> bool {
    let ok = crate::cpu::detected() >= isa;
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let verdict = if ok {
        "RAN"
    } else {
        "SKIPPED (not on this CPU)"
    };
    eprintln!("{verdict} {isa:?} kernels in {test}");
    ok
}

/// Proof that AVX-512F (and AVX2/FMA, which the tails use) are available.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512(());

impl Avx512 {
    /// # Safety
    /// The CPU must support `avx512f`, `avx2` and `fma`.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx512(())
    }

    /// The token where the CPU has AVX-512, for tests; says which test ran or skipped it.
    #[cfg(test)]
    pub(crate) fn new() -> Option<Self> {
        tested_isa(crate::cpu::Isa::Avx512).then_some(Avx512(()))
    }
}

// SAFETY (for every `unsafe` block in this impl): an `Avx512` exists only where avx512f
// (with avx2, fma and f16c) is available; pointer validity is the caller's.
impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    shared_x86_methods!();
    #[inline(always)]
    fn zero(self) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { load_unaligned(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { store_unaligned(p, v) }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_cvtph_ps(load_unaligned(p.cast())) }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let h: __m256i = load_unaligned(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn hsum(self, v: __m512) -> f32 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn hmax(self, v: __m512) -> f32 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe { _mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    fn exp(self, x: __m512) -> __m512 {
        // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
        unsafe {
            let x = _mm512_min_ps(
                _mm512_max_ps(x, _mm512_set1_ps(EXP_LO)),
                _mm512_set1_ps(EXP_HI),
            );
            let n = _mm512_roundscale_ps(
                _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
            let mut p = _mm512_set1_ps(EXP_P[0]);
            for &c in &EXP_P[1..] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
            }
            let p = _mm512_fmadd_ps(
                p,
                _mm512_mul_ps(r, r),
                _mm512_add_ps(r, _mm512_set1_ps(1.0)),
            );
            let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)),
                23,
            ));
            _mm512_mul_ps(p, pow2n)
        }
    }
}
