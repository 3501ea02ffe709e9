//! Gated activations.

use crate::simd::{simd_dispatch, Simd};
use rayon::prelude::*;

/// Elements above which the rows are split over threads (the exp makes this kernel
/// compute-bound enough to gain from it).
const PAR_MIN_ELEMS: usize = 1 << 16;

/// For each row of `x` laid out as `[gate(d) | up(d)]`: `out = silu(gate) * up` (`out` rows of `d`).
pub fn silu_and_mul(x: &[f32], out: &mut [f32], d: usize) {
    check_shapes(x, out, d);
    if d == 0 {
        return;
    }
    if out.len() < PAR_MIN_ELEMS || rayon::current_num_threads() == 1 {
        silu_and_mul_dispatch(x, out, d);
        return;
    }
    let rows = (PAR_MIN_ELEMS / 4).div_ceil(d);
    out.par_chunks_mut(rows * d)
        .zip(x.par_chunks(2 * rows * d))
        .for_each(|(o, x)| silu_and_mul_dispatch(x, o, d));
}

simd_dispatch! {
    fn silu_and_mul_dispatch(x: &[f32], out: &mut [f32], d: usize);
    generic = silu_and_mul_generic;
    avx512 = crate::simd::Avx2;
    scalar = silu_and_mul_scalar;
}

#[inline(always)]
fn silu_and_mul_generic<S: Simd>(s: S, x: &[f32], out: &mut [f32], d: usize) {
    let (one, zero) = (s.splat(1.0), s.zero());
    for (row, o) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
        let (gate, up) = row.split_at(d);
        let mut i = 0;
        while i + S::LANES <= d {
            // SAFETY: i + LANES <= d, the length of gate, up and o.
            unsafe {
                let g = s.load(gate.as_ptr().wrapping_add(i));
                let u = s.load(up.as_ptr().wrapping_add(i));
                let e = s.exp(s.sub(zero, g));
                s.store(
                    o.as_mut_ptr().wrapping_add(i),
                    s.div(s.mul(g, u), s.add(one, e)),
                );
            }
            i += S::LANES;
        }
        for ((o, &g), &u) in o[i..].iter_mut().zip(&gate[i..]).zip(&up[i..]) {
            *o = silu(g) * u;
        }
    }
}

fn check_shapes(x: &[f32], out: &[f32], d: usize) {
    assert!(
        d > 0 || (x.is_empty() && out.is_empty()),
        "silu_and_mul: d must be positive"
    );
    assert_eq!(
        x.len(),
        2 * out.len(),
        "silu_and_mul: x must be [rows, 2*d], out [rows, d]"
    );
    assert_eq!(
        out.len() % d.max(1),
        0,
        "silu_and_mul: out is not whole rows of d={d}"
    );
}

/// `v · sigmoid(v)`.
#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// Scalar twin of [`silu_and_mul`].
pub fn silu_and_mul_scalar(x: &[f32], out: &mut [f32], d: usize) {
    check_shapes(x, out, d);
    if d == 0 {
        return;
    }
    for (row, o) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
        let (gate, up) = row.split_at(d);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = silu(g) * u;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    #[test]
    fn scalar_matches_reference() {
        let mut r = rng(4);
        let (rows, d) = (3, 13);
        let x: Vec<f32> = rand_vec(&mut r, rows * 2 * d)
            .iter()
            .map(|v| v * 20.0)
            .collect();
        let mut out = vec![0.0; rows * d];
        silu_and_mul_scalar(&x, &mut out, d);
        let want: Vec<f32> = (0..rows * d)
            .map(|i| {
                let (row, c) = (i / d, i % d);
                let g = x[row * 2 * d + c] as f64;
                (g / (1.0 + (-g).exp()) * x[row * 2 * d + d + c] as f64) as f32
            })
            .collect();
        assert_close(&out, &want, 1e-6, 1e-6, "silu_and_mul_scalar");
    }

    #[test]
    fn dispatch_matches_scalar() {
        let mut r = rng(41);
        // Up to 1536 × 50 exercises the threaded split.
        for &(rows, d) in &[(1, 1), (3, 13), (2, 1536), (50, 1536), (7, 9)] {
            let mut x: Vec<f32> = rand_vec(&mut r, rows * 2 * d)
                .iter()
                .map(|v| v * 30.0)
                .collect();
            x[0] = -1000.0;
            let mut want = vec![0.0; rows * d];
            silu_and_mul_scalar(&x, &mut want, d);
            let mut got = vec![f32::NAN; rows * d];
            silu_and_mul(&x, &mut got, d);
            assert_close(&got, &want, 1e-30, 1e-6, "silu_and_mul");
        }
    }

    #[test]
    fn extreme_inputs_stay_finite() {
        assert_eq!(silu(-1000.0), -0.0);
        assert_eq!(silu(1000.0), 1000.0);
        assert_eq!(silu(0.0), 0.0);
    }
}
