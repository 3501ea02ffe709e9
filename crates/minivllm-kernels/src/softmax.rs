//! Softmax and log-softmax over a vector, and one entry of the log-softmax.

use crate::simd::{self, simd_dispatch, Simd};

simd_dispatch! {
    /// Softmax in place. Stable: the maximum is subtracted first. A vector of only `-inf`
    /// (everything masked) becomes uniform instead of NaN.
    pub fn softmax_inplace(x: &mut [f32]);
    generic = softmax_generic;
    avx512 = crate::simd::Avx2;
    scalar = softmax_inplace_scalar;
}

simd_dispatch! {
    /// Log-softmax in place, with the same conventions as [`softmax_inplace`].
    pub fn log_softmax_inplace(x: &mut [f32]);
    generic = log_softmax_generic;
    avx512 = crate::simd::Avx2;
    scalar = log_softmax_inplace_scalar;
}

simd_dispatch! {
    /// `log_softmax(x)[i]`, bit for bit what [`log_softmax_inplace`] leaves at `i`, without
    /// writing `x`: a sampler that reports only the chosen token's logprob would otherwise
    /// copy and rewrite a whole vocabulary row per token (64 rows of 152k logits are 39 MB
    /// a step). `i` must be an index of `x`.
    pub fn log_softmax_at(x: &[f32], i: usize) -> f32;
    generic = log_softmax_at_generic;
    avx512 = crate::simd::Avx2;
    scalar = log_softmax_at_scalar;
}

#[inline(always)]
fn softmax_generic<S: Simd>(s: S, x: &mut [f32]) {
    let max = simd::max(s, x);
    if max == f32::NEG_INFINITY {
        return softmax_inplace_scalar(x);
    }
    let sum = simd::exp_shifted(s, x, max);
    simd::scale(s, x, 1.0 / sum);
}

#[inline(always)]
fn log_softmax_generic<S: Simd>(s: S, x: &mut [f32]) {
    match log_softmax_shift(s, x) {
        Some(shift) => simd::add_scalar(s, x, -shift),
        None => log_softmax_inplace_scalar(x),
    }
}

#[inline(always)]
fn log_softmax_at_generic<S: Simd>(s: S, x: &[f32], i: usize) -> f32 {
    match log_softmax_shift(s, x) {
        // `x + (-shift)`: the in-place form's `add_scalar`, the same rounding.
        Some(shift) => x[i] + -shift,
        None => log_softmax_at_scalar(x, i),
    }
}

/// What the log-softmax subtracts, `max + ln Σ e^(x - max)`, for the in-place form and the
/// single entry alike (so that they agree bit for bit); `None` when nothing is above
/// `-inf`.
#[inline(always)]
fn log_softmax_shift<S: Simd>(s: S, x: &[f32]) -> Option<f32> {
    let max = simd::max(s, x);
    // Not `bool::then` with a closure: a closure is compiled without the caller's target
    // features, and the vectorised sum inside it ran as one call per intrinsic (16 % of a
    // batched step on a 262k vocabulary).
    if max == f32::NEG_INFINITY {
        return None;
    }
    Some(max + simd::exp_sum(s, x, max).ln())
}

/// Scalar twin of [`log_softmax_shift`].
fn log_softmax_shift_scalar(x: &[f32]) -> Option<f32> {
    let max = max_scalar(x);
    (max != f32::NEG_INFINITY).then(|| {
        let sum: f32 = x.iter().map(|&v| (v - max).exp()).sum();
        max + sum.ln()
    })
}

fn max_scalar(x: &[f32]) -> f32 {
    x.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Scalar twin of [`softmax_inplace`].
pub fn softmax_inplace_scalar(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = max_scalar(x);
    if max == f32::NEG_INFINITY {
        x.fill(1.0 / x.len() as f32);
        return;
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Scalar twin of [`log_softmax_inplace`].
pub fn log_softmax_inplace_scalar(x: &mut [f32]) {
    match log_softmax_shift_scalar(x) {
        Some(shift) => x.iter_mut().for_each(|v| *v -= shift),
        None => x.fill(-(x.len() as f32).ln()),
    }
}

/// Scalar twin of [`log_softmax_at`].
pub fn log_softmax_at_scalar(x: &[f32], i: usize) -> f32 {
    match log_softmax_shift_scalar(x) {
        Some(shift) => x[i] - shift,
        None => {
            assert!(
                i < x.len(),
                "log_softmax_at: index {i} of {} values",
                x.len()
            );
            -(x.len() as f32).ln()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn reference(x: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
        let p = x
            .iter()
            .map(|&v| ((v as f64 - max).exp() / sum) as f32)
            .collect();
        let lp = x
            .iter()
            .map(|&v| (v as f64 - max - sum.ln()) as f32)
            .collect();
        (p, lp)
    }

    #[test]
    fn scalar_matches_reference() {
        let mut r = rng(5);
        for &n in &[1usize, 2, 7, 100, 1001] {
            let mut x: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 50.0).collect();
            x[0] = 1e4; // would overflow exp() without the max shift
            let (p, lp) = reference(&x);
            let mut y = x.clone();
            softmax_inplace_scalar(&mut y);
            assert_close(&y, &p, 1e-6, 1e-5, "softmax_inplace_scalar");
            let mut y = x.clone();
            log_softmax_inplace_scalar(&mut y);
            assert_close(&y, &lp, 1e-3, 1e-6, "log_softmax_inplace_scalar");
        }
    }

    #[test]
    fn dispatch_matches_scalar() {
        let mut r = rng(51);
        for &n in &[1usize, 2, 7, 8, 9, 100, 1001, 49152] {
            let mut x: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 50.0).collect();
            x[n / 2] = f32::NEG_INFINITY;
            let (mut want, mut got) = (x.clone(), x.clone());
            softmax_inplace_scalar(&mut want);
            softmax_inplace(&mut got);
            assert_close(&got, &want, 1e-9, 1e-5, "softmax_inplace");
            let (mut want, mut got) = (x.clone(), x.clone());
            log_softmax_inplace_scalar(&mut want);
            log_softmax_inplace(&mut got);
            assert_close(&got, &want, 1e-4, 1e-6, "log_softmax_inplace");
        }
    }

    /// One entry equals what the in-place form leaves there, bit for bit, on each path
    /// (masked entries and a fully masked row included).
    #[test]
    fn one_entry_matches_in_place() {
        let mut r = rng(52);
        for &n in &[1usize, 7, 9, 100, 1001, 49152] {
            let mut x: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 50.0).collect();
            x[n / 2] = f32::NEG_INFINITY;
            let (mut want, mut want_scalar) = (x.clone(), x.clone());
            log_softmax_inplace(&mut want);
            log_softmax_inplace_scalar(&mut want_scalar);
            for i in [0, n / 2, n - 1, n / 3] {
                assert_eq!(
                    log_softmax_at(&x, i).to_bits(),
                    want[i].to_bits(),
                    "n={n} i={i}"
                );
                assert_eq!(
                    log_softmax_at_scalar(&x, i).to_bits(),
                    want_scalar[i].to_bits(),
                    "scalar n={n} i={i}"
                );
            }
        }
        let masked = [f32::NEG_INFINITY; 5];
        assert_eq!(log_softmax_at(&masked, 3), -(5f32).ln());
        assert_eq!(log_softmax_at_scalar(&masked, 3), -(5f32).ln());
    }

    #[test]
    fn masked_and_empty() {
        let mut x = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        softmax_inplace(&mut x);
        assert_eq!(x, [0.0, 1.0, 0.0]);
        let mut x = [f32::NEG_INFINITY; 4];
        softmax_inplace(&mut x);
        assert_eq!(x, [0.25; 4]);
        let mut x = [f32::NEG_INFINITY, 0.0];
        log_softmax_inplace(&mut x);
        assert_eq!(x, [f32::NEG_INFINITY, 0.0]);
        softmax_inplace(&mut []);
        log_softmax_inplace(&mut []);
    }
}
