//! SIMD building blocks shared by the kernels.
//!
//! Kernels are written once, generic over [`Simd`], and instantiated inside
//! `#[target_feature]` wrappers made by [`simd_dispatch!`]: every helper here is
//! `#[inline(always)]`, so it is compiled into the wrapper with that wrapper's instruction set.
//! A token type (`Avx2`, `Avx512`) can only be obtained where its features are known to
//! exist, which is what makes the safe methods of the trait sound.

use half::{bf16, f16};
/// One register of `LANES` f32 lanes and the operations the kernels need on it.
pub(crate) trait Simd: Copy + Send + Sync {
    type V: Copy;
    const LANES: usize;
    fn zero(self) -> Self::V;
    fn splat(self, x: f32) -> Self::V;
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// # Safety
    /// `p..p + LANES` must be writable.
    unsafe fn store(self, p: *mut f32, v: Self::V);
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    fn div(self, a: Self::V, b: Self::V) -> Self::V;
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`.
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn hsum(self, v: Self::V) -> f32;
    fn hmax(self, v: Self::V) -> f32;
    /// `[hsum(v[0]), .., hsum(v[3])]`.
    #[inline(always)]
    fn hsum4(self, v: [Self::V; 4]) -> [f32; 4] {
        // Not `map`: a closure would not get the caller's target features.
        [
            self.hsum(v[0]),
            self.hsum(v[1]),
            self.hsum(v[2]),
            self.hsum(v[3]),
        ]
    }
    /// `e^x`, within a few ulp of `f32::exp` over the range where it is finite and normal.
    fn exp(self, x: Self::V) -> Self::V;
    /// Loads `LANES` f16 values as f32.
    ///
    /// # Safety
    /// `LANES` values must be readable at `p`.
    unsafe fn load_f16(self, p: *const f16) -> Self::V;
    /// Loads `LANES` bf16 values as f32.
    ///
    /// # Safety
    /// `LANES` values must be readable at `p`.
    unsafe fn load_bf16(self, p: *const bf16) -> Self::V;
    /// Hints that the cache line holding `p` will be read soon. Any address is allowed.
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        let _ = p;
    }
    /// Transposes an 8 × 8 block: `dst[q·dst_stride + r] = src[r·src_stride + q]`.
    ///
    /// # Safety
    /// Rows `0..8` of 8 floats must be readable at `src` and writable at `dst` with the
    /// given strides, and not overlap.
    #[inline(always)]
    unsafe fn transpose8(
        self,
        src: *const f32,
        src_stride: usize,
        dst: *mut f32,
        dst_stride: usize,
    ) {
        for r in 0..8 {
            for q in 0..8 {
                // SAFETY: the caller's.
                unsafe {
                    *dst.wrapping_add(q * dst_stride + r) = *src.wrapping_add(r * src_stride + q)
                };
            }
        }
    }
}

/// The portable fallback: one lane, exactly the scalar arithmetic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalar;

impl Simd for Scalar {
    type V = f32;
    const LANES: usize = 1;
    #[inline(always)]
    fn zero(self) -> f32 {
        0.0
    }
    #[inline(always)]
    fn splat(self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> f32 {
        // SAFETY: the caller guarantees one readable f32.
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: f32) {
        // SAFETY: the caller guarantees one writable f32.
        unsafe { *p = v }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const f16) -> f32 {
        // SAFETY: the caller guarantees one readable value.
        unsafe { (*p).to_f32() }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> f32 {
        // SAFETY: the caller guarantees one readable value.
        unsafe { (*p).to_f32() }
    }
    #[inline(always)]
    fn add(self, a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(self, a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(self, a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(self, a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn max(self, a: f32, b: f32) -> f32 {
        a.max(b)
    }
    #[inline(always)]
    fn fma(self, a: f32, b: f32, c: f32) -> f32 {
        // A plain multiply-add: `mul_add` is a slow libm call where FMA is not available.
        a * b + c
    }
    #[inline(always)]
    fn hsum(self, v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn hmax(self, v: f32) -> f32 {
        v
    }
    #[inline(always)]
    fn exp(self, x: f32) -> f32 {
        x.exp()
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Defines a function that runs a kernel generic over [`Simd`] compiled for the ISA that
/// [`crate::cpu::isa`] picks:
///
/// ```text
/// simd_dispatch! {
///     fn name(a: &[f32], b: f32) -> f32;
///     generic = impl_fn;            // fn impl_fn<S: Simd>(s: S, a: &[f32], b: f32) -> f32
///     avx512 = crate::simd::Avx2;   // token to run with on AVX-512 machines
///     scalar = fallback_fn;         // fn fallback_fn(a: &[f32], b: f32) -> f32
/// }
/// ```
///
/// `unsafe fn` is accepted too, for kernels over raw pointers; `generic` and `scalar` are
/// then unsafe with the same contract.
///
/// Threading belongs outside: a closure does not inherit the target features of the
/// function it is written in, so a rayon task must call a dispatched function itself.
macro_rules! simd_dispatch {
    (
        $(#[$attr:meta])*
        $vis:vis fn $($rest:tt)*
    ) => {
        $crate::simd::simd_dispatch!(@def [$(#[$attr])* $vis] [] $($rest)*);
    };
    (
        $(#[$attr:meta])*
        $vis:vis unsafe fn $($rest:tt)*
    ) => {
        $crate::simd::simd_dispatch!(@def [$(#[$attr])* $vis] [unsafe] $($rest)*);
    };
    (
        @def [$($head:tt)*] [$($unsafety:tt)?]
        $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?;
        generic = $imp:path;
        avx512 = $t512:ty;
        scalar = $fallback:expr;
    ) => {
        #[allow(unused_unsafe)]
        $($head)* $($unsafety)? fn $name($($arg: $ty),*) $(-> $ret)? {
            match $crate::cpu::isa() {
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::Isa::Avx512 => {
                    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
                    $($unsafety)? fn run($($arg: $ty),*) $(-> $ret)? {
                        // SAFETY: this function is compiled for, and only called with, these
                        // features; the rest of the contract is the caller's.
                        unsafe { $imp(<$t512>::new_unchecked(), $($arg),*) }
                    }
                    // SAFETY: `isa()` says Avx512 only where avx512f, avx2, fma and f16c exist.
                    unsafe { run($($arg),*) }
                }
                #[cfg(target_arch = "x86_64")]
                $crate::cpu::Isa::Avx2 => {
                    #[target_feature(enable = "avx2,fma,f16c")]
                    $($unsafety)? fn run($($arg: $ty),*) $(-> $ret)? {
                        // SAFETY: as above, for avx2 and fma.
                        unsafe { $imp($crate::simd::Avx2::new_unchecked(), $($arg),*) }
                    }
                    // SAFETY: `isa()` says Avx2 only where avx2, fma and f16c exist.
                    unsafe { run($($arg),*) }
                }
                // SAFETY: the caller's contract, where the function is unsafe.
                _ => unsafe { $fallback($($arg),*) },
            }
        }
    };
}
pub(crate) use simd_dispatch;

/// Runs `body` with `i` at each full vector (a multiple of `LANES`) of `0..n` and evaluates
/// to where the scalar tail starts.
///
/// A macro rather than a function taking a closure: a closure is compiled without the
/// caller's target features, so the intrinsics inside it would not inline.
macro_rules! vector_loop {
    ($s:ty, $n:expr, |$i:ident| $body:block) => {{
        let n: usize = $n;
        let mut $i = 0;
        while $i + <$s as Simd>::LANES <= n {
            $body
            $i += <$s as Simd>::LANES;
        }
        $i
    }};
}

/// `Σ a[i]·b[i]` over the shorter of the two.
#[inline(always)]
pub(crate) fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let l = S::LANES;
    // Four independent chains hide the FMA latency.
    let mut acc = [s.zero(); 4];
    let mut i = 0;
    while i + 4 * l <= n {
        for (j, acc) in acc.iter_mut().enumerate() {
            // SAFETY: i + (j + 1)·l <= n, the length of both slices.
            unsafe {
                *acc = s.fma(
                    s.load(a.as_ptr().wrapping_add(i + j * l)),
                    s.load(b.as_ptr().wrapping_add(i + j * l)),
                    *acc,
                );
            }
        }
        i += 4 * l;
    }
    let tail = i + vector_loop!(S, n - i, |j| {
        // SAFETY: i + j + l <= n.
        unsafe {
            acc[0] = s.fma(
                s.load(a.as_ptr().wrapping_add(i + j)),
                s.load(b.as_ptr().wrapping_add(i + j)),
                acc[0],
            )
        }
    });
    let acc = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    s.hsum(acc) + dot_scalar(&a[tail..], &b[tail..])
}

/// `y[i] += a · x[i]`.
#[inline(always)]
pub(crate) fn axpy<S: Simd>(s: S, y: &mut [f32], a: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let av = s.splat(a);
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n, the length of both slices.
        unsafe {
            let p = y.as_mut_ptr().wrapping_add(i);
            s.store(p, s.fma(av, s.load(x.as_ptr().wrapping_add(i)), s.load(p)));
        }
    });
    for (y, &x) in y[tail..n].iter_mut().zip(&x[tail..n]) {
        *y += a * x;
    }
}

/// `y[i] *= a`.
#[inline(always)]
pub(crate) fn scale<S: Simd>(s: S, y: &mut [f32], a: f32) {
    let av = s.splat(a);
    let n = y.len();
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n.
        unsafe {
            let p = y.as_mut_ptr().wrapping_add(i);
            s.store(p, s.mul(av, s.load(p)));
        }
    });
    y[tail..].iter_mut().for_each(|y| *y *= a);
}

/// `max x[i]`, `-inf` for an empty slice.
#[inline(always)]
pub(crate) fn max<S: Simd>(s: S, x: &[f32]) -> f32 {
    let mut m = s.splat(f32::NEG_INFINITY);
    let tail = vector_loop!(S, x.len(), |i| {
        // SAFETY: i + LANES <= x.len().
        unsafe { m = s.max(m, s.load(x.as_ptr().wrapping_add(i))) }
    });
    x[tail..].iter().copied().fold(s.hmax(m), f32::max)
}

/// `max x[i]` over the values that are not NaN, `-inf` where there are none.
#[inline(always)]
pub(crate) fn max_ignoring_nan<S: Simd>(s: S, x: &[f32]) -> f32 {
    let mut m = s.splat(f32::NEG_INFINITY);
    let tail = vector_loop!(S, x.len(), |i| {
        // The loaded values second: x86's max returns its second operand where either is
        // NaN, so a NaN never enters `m`.
        // SAFETY: i + LANES <= x.len().
        unsafe { m = s.max(s.load(x.as_ptr().wrapping_add(i)), m) }
    });
    x[tail..].iter().copied().fold(s.hmax(m), f32::max)
}

/// `Σ e^(x[i] - shift)`, summed in [`exp_shifted`]'s order (so the two agree bit for bit).
#[inline(always)]
pub(crate) fn exp_sum<S: Simd>(s: S, x: &[f32], shift: f32) -> f32 {
    let sv = s.splat(shift);
    let mut sum = s.zero();
    let tail = vector_loop!(S, x.len(), |i| {
        // SAFETY: i + LANES <= x.len().
        unsafe { sum = s.add(sum, s.exp(s.sub(s.load(x.as_ptr().wrapping_add(i)), sv))) }
    });
    x[tail..]
        .iter()
        .fold(s.hsum(sum), |total, &v| total + (v - shift).exp())
}

/// `x[i] = e^(x[i] - shift)`, returning `Σ x[i]`.
#[inline(always)]
pub(crate) fn exp_shifted<S: Simd>(s: S, x: &mut [f32], shift: f32) -> f32 {
    let sv = s.splat(shift);
    let mut sum = s.zero();
    let n = x.len();
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n.
        unsafe {
            let p = x.as_mut_ptr().wrapping_add(i);
            let e = s.exp(s.sub(s.load(p), sv));
            s.store(p, e);
            sum = s.add(sum, e);
        }
    });
    let mut total = s.hsum(sum);
    for v in &mut x[tail..] {
        *v = (*v - shift).exp();
        total += *v;
    }
    total
}

/// `x[i] = cap · tanh(x[i] / cap)`, as [`crate::attention::softcap`] computes it.
#[inline(always)]
pub(crate) fn softcap<S: Simd>(s: S, x: &mut [f32], cap: f32) {
    let (one, two, k) = (s.splat(1.0), s.splat(2.0), s.splat(2.0 / cap));
    let cv = s.splat(cap);
    let n = x.len();
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n.
        unsafe {
            let p = x.as_mut_ptr().wrapping_add(i);
            let e = s.exp(s.mul(k, s.load(p)));
            s.store(p, s.mul(cv, s.sub(one, s.div(two, s.add(one, e)))));
        }
    });
    x[tail..]
        .iter_mut()
        .for_each(|v| *v = crate::attention::softcap(*v, cap));
}

/// `x[i] += c`.
#[inline(always)]
pub(crate) fn add_scalar<S: Simd>(s: S, x: &mut [f32], c: f32) {
    let cv = s.splat(c);
    let n = x.len();
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n.
        unsafe {
            let p = x.as_mut_ptr().wrapping_add(i);
            s.store(p, s.add(s.load(p), cv));
        }
    });
    x[tail..].iter_mut().for_each(|v| *v += c);
}

/// `out[i] = a[i] · b[i] · c` over the shortest of the three.
#[inline(always)]
pub(crate) fn mul_scaled<S: Simd>(s: S, out: &mut [f32], a: &[f32], b: &[f32], c: f32) {
    let n = out.len().min(a.len()).min(b.len());
    let cv = s.splat(c);
    let tail = vector_loop!(S, n, |i| {
        // SAFETY: i + LANES <= n, within all three slices.
        unsafe {
            let v = s.mul(
                s.mul(s.load(a.as_ptr().wrapping_add(i)), cv),
                s.load(b.as_ptr().wrapping_add(i)),
            );
            s.store(out.as_mut_ptr().wrapping_add(i), v);
        }
    });
    for ((o, &a), &b) in out[tail..n].iter_mut().zip(&a[tail..n]).zip(&b[tail..n]) {
        *o = a * c * b;
    }
}

/// `Σ a[i]·b[i]` over the shorter of the two.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn check_helpers<S: Simd>(s: S) {
        let mut r = rng(7);
        let v: Vec<f32> = rand_vec(&mut r, 4 * S::LANES);
        let regs: [S::V; 4] =
            // SAFETY: the token exists only where the CPU has this ISA; pointers follow the method's contract.
            std::array::from_fn(|i| unsafe { s.load(v[i * S::LANES..].as_ptr()) });
        let sums = s.hsum4(regs);
        for (i, sum) in sums.iter().enumerate() {
            let want: f32 = v[i * S::LANES..(i + 1) * S::LANES].iter().sum();
            assert!((sum - want).abs() < 1e-5, "hsum4 lane {i}: {sum} vs {want}");
        }
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100] {
            let a = rand_vec(&mut r, n);
            let b = rand_vec(&mut r, n);
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            let tol = 1e-6 * (n as f32).sqrt().max(1.0);
            assert!((dot(s, &a, &b) - want).abs() <= tol, "dot n={n}");
            assert_eq!(
                max(s, &a),
                a.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            );

            let mut y = b.clone();
            axpy(s, &mut y, 0.5, &a);
            let want: Vec<f32> = b.iter().zip(&a).map(|(y, x)| y + 0.5 * x).collect();
            assert_close(&y, &want, 1e-7, 1e-6, "axpy");
            scale(s, &mut y, 2.0);
            let want: Vec<f32> = want.iter().map(|v| v * 2.0).collect();
            assert_close(&y, &want, 0.0, 0.0, "scale");
            add_scalar(s, &mut y, -1.5);
            let want: Vec<f32> = want.iter().map(|v| v - 1.5).collect();
            assert_close(&y, &want, 0.0, 0.0, "add_scalar");
            mul_scaled(s, &mut y, &a, &b, 3.0);
            let want: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a * 3.0 * b).collect();
            assert_close(&y, &want, 0.0, 1e-6, "mul_scaled");

            let mut e: Vec<f32> = a.iter().map(|v| v * 80.0).collect();
            let want: Vec<f32> = e.iter().map(|v| (v - 3.0f32).exp()).collect();
            let peek = exp_sum(s, &e, 3.0);
            let sum = exp_shifted(s, &mut e, 3.0);
            assert_eq!(peek, sum);
            assert_close(&e, &want, 1e-37, 1e-6, "exp_shifted");
            let want_sum: f32 = want.iter().sum();
            assert!(
                (sum - want_sum).abs() <= 1e-5 * want_sum.abs() + 1e-30,
                "exp sum n={n}"
            );
        }
    }

    /// The exponential over its whole finite range, the clamps and the extremes.
    fn check_exp<S: Simd>(s: S) {
        let mut x: Vec<f32> = (-8800..=8800).map(|i| i as f32 * 0.01).collect();
        x.extend([-1000.0, -87.5, -88.0, 88.3, 1000.0, 0.0, -0.0, 1e-30]);
        let want: Vec<f32> = x.iter().map(|v| v.exp()).collect();
        let mut got = x.clone();
        exp_shifted(s, &mut got, 0.0);
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let x = x[i];
            if x < -87.33 {
                // Below this e^x is subnormal; the fast path flushes towards zero.
                assert!((0.0..=1.2e-38).contains(&g), "exp({x}) = {g}");
            } else if x > 88.3 {
                assert!(g > 2e38, "exp({x}) = {g}");
            } else {
                assert!((g - w).abs() <= 4e-7 * w, "exp({x}) = {g}, want {w}");
            }
        }
    }

    #[test]
    fn scalar_helpers() {
        check_helpers(Scalar);
        check_exp(Scalar);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_helpers() {
        if let Some(s) = Avx2::new() {
            check_helpers(s);
            check_exp(s);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_helpers() {
        if let Some(s) = Avx512::new() {
            check_helpers(s);
            check_exp(s);
        }
    }
}
