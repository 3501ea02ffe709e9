//! The integer core of the x86 tiles: exact 32-bit sums of byte products, one per lane.
//!
//! This is the only step that differs between the instruction sets. AVX2 multiplies byte
//! pairs with `vpmaddubsw` into 16 bits and widens with `vpmaddwd`; the VNNI extensions
//! fuse all of it into one `vpdpbusd` per vector (AVX512-VNNI's 512-bit kernels, in
//! `avx512.rs`, call it directly). The sums are exact in every case, so every
//! ISA gives the kernels the same integers, and the tiles the same bits.

use std::arch::x86_64::*;

/// `acc + Σ_t Σ_e u[t]_e · s[t]_e` per 32-bit lane, `e` over the lane's four bytes, `u`
/// unsigned and `s` signed.
pub(super) trait IntDot {
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
}

/// AVX2: `vpmaddubsw` pair sums, `CHUNK` of them added in 16 bits, widened by `vpmaddwd`.
pub(super) struct Maddubs;

impl IntDot for Maddubs {
    #[inline(always)]
    unsafe fn dot<const N: usize, const CHUNK: usize>(
        acc: __m256i,
        u: &[__m256i; N],
        s: &[__m256i; N],
    ) -> __m256i {
        const { assert!(CHUNK > 0) };
        // SAFETY: register-only AVX2 intrinsics; the caller has AVX2.
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let mut acc = acc;
            for c in (0..N).step_by(CHUNK) {
                let mut s16 = _mm256_maddubs_epi16(u[c], s[c]);
                for t in c + 1..(c + CHUNK).min(N) {
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u[t], s[t]));
                }
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s16, ones));
            }
            acc
        }
    }
}

/// AVX-VNNI (VEX-encoded `vpdpbusd`: Intel since Alder Lake, AMD since Zen 5).
pub(super) struct AvxVnni;

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
}
