//! RMSNorm.

use crate::simd::{self, simd_dispatch, Simd};

/// Each row `r` of `x` (rows of `weight.len()`): `out = r / sqrt(mean(r²) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    check_rows(x.len(), weight, "rms_norm");
    assert_eq!(x.len(), out.len(), "rms_norm: x and out differ in length");
    rms_norm_dispatch(x, weight, eps, out);
}

/// Row-wise: `residual += x; x = rms_norm(residual) * weight` (vLLM's fused_add_rms_norm).
pub fn fused_add_rms_norm(x: &mut [f32], residual: &mut [f32], weight: &[f32], eps: f32) {
    check_rows(x.len(), weight, "fused_add_rms_norm");
    assert_eq!(
        x.len(),
        residual.len(),
        "fused_add_rms_norm: x and residual differ in length"
    );
    fused_add_rms_norm_dispatch(x, residual, weight, eps);
}

simd_dispatch! {
    fn rms_norm_dispatch(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]);
    generic = rms_norm_generic;
    avx512 = crate::simd::Avx2;
    scalar = rms_norm_scalar;
}

simd_dispatch! {
    fn fused_add_rms_norm_dispatch(x: &mut [f32], residual: &mut [f32], weight: &[f32], eps: f32);
    generic = fused_add_rms_norm_generic;
    avx512 = crate::simd::Avx2;
    scalar = fused_add_rms_norm_scalar;
}

#[inline(always)]
fn rms_norm_generic<S: Simd>(s: S, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (r, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = inv_rms(simd::dot(s, r, r), d, eps);
        simd::mul_scaled(s, o, r, weight, inv);
    }
}

#[inline(always)]
fn fused_add_rms_norm_generic<S: Simd>(
    s: S,
    x: &mut [f32],
    residual: &mut [f32],
    weight: &[f32],
    eps: f32,
) {
    let d = weight.len();
    for (xr, rr) in x.chunks_exact_mut(d).zip(residual.chunks_exact_mut(d)) {
        // y + 1·x is exact in an FMA, so the residual matches the scalar sum bit for bit.
        simd::axpy(s, rr, 1.0, xr);
        let inv = inv_rms(simd::dot(s, rr, rr), d, eps);
        simd::mul_scaled(s, xr, rr, weight, inv);
    }
}

/// `1 / sqrt(sum_sq / d + eps)`.
#[inline(always)]
fn inv_rms(sum_sq: f32, d: usize, eps: f32) -> f32 {
    1.0 / (sum_sq / d as f32 + eps).sqrt()
}

fn check_rows(len: usize, weight: &[f32], what: &str) {
    assert!(
        !weight.is_empty() && len.is_multiple_of(weight.len()),
        "{what}: length {len} is not a whole number of rows of {}",
        weight.len()
    );
}

/// `1 / sqrt(mean(r²) + eps)`.
fn inv_rms_scalar(r: &[f32], eps: f32) -> f32 {
    inv_rms(r.iter().map(|v| v * v).sum(), r.len(), eps)
}

/// Scalar twin of [`rms_norm`].
pub fn rms_norm_scalar(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    check_rows(x.len(), weight, "rms_norm");
    assert_eq!(x.len(), out.len(), "rms_norm: x and out differ in length");
    let d = weight.len();
    for (r, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let inv = inv_rms_scalar(r, eps);
        for ((o, &v), &g) in o.iter_mut().zip(r).zip(weight) {
            *o = v * inv * g;
        }
    }
}

/// Scalar twin of [`fused_add_rms_norm`].
pub fn fused_add_rms_norm_scalar(x: &mut [f32], residual: &mut [f32], weight: &[f32], eps: f32) {
    check_rows(x.len(), weight, "fused_add_rms_norm");
    assert_eq!(
        x.len(),
        residual.len(),
        "fused_add_rms_norm: x and residual differ in length"
    );
    let d = weight.len();
    for (xr, rr) in x.chunks_exact_mut(d).zip(residual.chunks_exact_mut(d)) {
        for (r, &v) in rr.iter_mut().zip(xr.iter()) {
            *r += v;
        }
        let inv = inv_rms_scalar(rr, eps);
        for ((o, &v), &g) in xr.iter_mut().zip(rr.iter()).zip(weight) {
            *o = v * inv * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn reference(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let d = w.len();
        let mut out = Vec::with_capacity(x.len());
        for r in x.chunks(d) {
            let ms = r.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            out.extend(
                r.iter()
                    .zip(w)
                    .map(|(&v, &g)| (v as f64 * inv * g as f64) as f32),
            );
        }
        out
    }

    #[test]
    fn scalar_matches_reference() {
        let mut r = rng(2);
        for &(rows, d) in &[(1, 1), (3, 7), (2, 576), (5, 33)] {
            let x = rand_vec(&mut r, rows * d);
            let w = rand_vec(&mut r, d);
            let mut out = vec![0.0; rows * d];
            rms_norm_scalar(&x, &w, 1e-5, &mut out);
            assert_close(
                &out,
                &reference(&x, &w, 1e-5),
                1e-5,
                1e-5,
                "rms_norm_scalar",
            );

            let mut xs = x.clone();
            let mut res = rand_vec(&mut r, rows * d);
            let sum: Vec<f32> = res.iter().zip(&x).map(|(a, b)| a + b).collect();
            fused_add_rms_norm_scalar(&mut xs, &mut res, &w, 1e-5);
            assert_eq!(res, sum);
            assert_close(
                &xs,
                &reference(&sum, &w, 1e-5),
                1e-5,
                1e-5,
                "fused_add_rms_norm_scalar",
            );
        }
    }

    #[test]
    fn dispatch_matches_scalar() {
        let mut r = rng(21);
        for &(rows, d) in &[(1, 1), (3, 7), (2, 576), (5, 33), (4, 16), (1, 1000)] {
            let x = rand_vec(&mut r, rows * d);
            let w = rand_vec(&mut r, d);
            let mut want = vec![0.0; rows * d];
            rms_norm_scalar(&x, &w, 1e-6, &mut want);
            let mut got = vec![0.0; rows * d];
            rms_norm(&x, &w, 1e-6, &mut got);
            assert_close(&got, &want, 1e-6, 1e-5, "rms_norm");

            let res = rand_vec(&mut r, rows * d);
            let (mut xw, mut rw) = (x.clone(), res.clone());
            fused_add_rms_norm_scalar(&mut xw, &mut rw, &w, 1e-6);
            let (mut xg, mut rg) = (x.clone(), res.clone());
            fused_add_rms_norm(&mut xg, &mut rg, &w, 1e-6);
            assert_eq!(rg, rw, "fused_add_rms_norm residual");
            assert_close(&xg, &xw, 1e-6, 1e-5, "fused_add_rms_norm");
        }
    }

    #[test]
    fn zero_rows_are_fine() {
        rms_norm(&[], &[1.0; 4], 1e-6, &mut []);
        fused_add_rms_norm(&mut [], &mut [], &[1.0; 4], 1e-6);
        let mut out = [9.0; 4];
        rms_norm(&[0.0; 4], &[1.0; 4], 1e-6, &mut out);
        assert_eq!(out, [0.0; 4]);
    }
}
