//! Gated activations.

use crate::simd::{simd_dispatch, Simd};
use rayon::prelude::*;

/// Elements above which the rows are split over threads (the exp makes this kernel
/// compute-bound enough to gain from it).
const PAR_MIN_ELEMS: usize = 1 << 16;

/// For each row of `x` laid out as `[gate(d) | up(d)]`: `out = silu(gate) * up` (`out` rows of `d`).
pub fn silu_and_mul(x: &[f32], out: &mut [f32], d: usize) {
    gated(x, out, d, silu_and_mul_dispatch);
}

/// For each row of `x` laid out as `[gate(d) | up(d)]`: `out = gelu_tanh(gate) * up`
/// (GeGLU with PyTorch's `gelu(approximate="tanh")`, Gemma's `gelu_pytorch_tanh`).
pub fn gelu_tanh_and_mul(x: &[f32], out: &mut [f32], d: usize) {
    gated(x, out, d, gelu_tanh_and_mul_dispatch);
}

fn gated(x: &[f32], out: &mut [f32], d: usize, kernel: fn(&[f32], &mut [f32], usize)) {
    check_shapes(x, out, d);
    if d == 0 {
        return;
    }
    if out.len() < PAR_MIN_ELEMS || rayon::current_num_threads() == 1 {
        kernel(x, out, d);
        return;
    }
    let rows = (PAR_MIN_ELEMS / 4).div_ceil(d);
    out.par_chunks_mut(rows * d)
        .zip(x.par_chunks(2 * rows * d))
        .for_each(|(o, x)| kernel(x, o, d));
}

/// `x = silu(x)` in place (Gated DeltaNet's convolution output).
pub fn silu_inplace(x: &mut [f32]) {
    silu_inplace_dispatch(x)
}

simd_dispatch! {
    fn silu_inplace_dispatch(x: &mut [f32]);
    generic = silu_inplace_generic;
    avx512 = crate::simd::Avx2;
    scalar = silu_inplace_scalar;
}

#[inline(always)]
fn silu_inplace_generic<S: Simd>(s: S, x: &mut [f32]) {
    let (one, zero) = (s.splat(1.0), s.zero());
    let mut i = 0;
    while i + S::LANES <= x.len() {
        let p = x.as_mut_ptr().wrapping_add(i);
        // SAFETY: i + LANES <= x.len().
        unsafe {
            let v = s.load(p);
            s.store(p, s.div(v, s.add(one, s.exp(s.sub(zero, v)))));
        }
        i += S::LANES;
    }
    silu_inplace_scalar(&mut x[i..]);
}

/// Scalar twin of [`silu_inplace`].
pub fn silu_inplace_scalar(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

simd_dispatch! {
    fn silu_and_mul_dispatch(x: &[f32], out: &mut [f32], d: usize);
    generic = silu_and_mul_generic;
    avx512 = crate::simd::Avx2;
    scalar = silu_and_mul_scalar;
}

simd_dispatch! {
    fn gelu_tanh_and_mul_dispatch(x: &[f32], out: &mut [f32], d: usize);
    generic = gelu_tanh_and_mul_generic;
    avx512 = crate::simd::Avx2;
    scalar = gelu_tanh_and_mul_scalar;
}

#[inline(always)]
fn silu_and_mul_generic<S: Simd>(s: S, x: &[f32], out: &mut [f32], d: usize) {
    gated_generic::<S, false>(s, x, out, d)
}

#[inline(always)]
fn gelu_tanh_and_mul_generic<S: Simd>(s: S, x: &[f32], out: &mut [f32], d: usize) {
    gated_generic::<S, true>(s, x, out, d)
}

/// `out = gate · sigmoid(z) · up` with `z = gate` (SiLU) or `z = 2u` (tanh GELU, since
/// `(1 + tanh(u)) / 2 = sigmoid(2u)`); the scalar twins compute the same expression.
#[inline(always)]
fn gated_generic<S: Simd, const GELU: bool>(s: S, x: &[f32], out: &mut [f32], d: usize) {
    let (one, zero) = (s.splat(1.0), s.zero());
    let (c1, c3) = (s.splat(-2.0 * SQRT_2_OVER_PI), s.splat(GELU_CUBIC));
    for (row, o) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
        let (gate, up) = row.split_at(d);
        let mut i = 0;
        while i + S::LANES <= d {
            // SAFETY: i + LANES <= d, the length of gate, up and o.
            unsafe {
                let g = s.load(gate.as_ptr().wrapping_add(i));
                let u = s.load(up.as_ptr().wrapping_add(i));
                let minus_z = if GELU {
                    // -2u = -2·sqrt(2/π)·(g + 0.044715·g³), as gelu_tanh below.
                    s.mul(c1, s.fma(s.mul(c3, g), s.mul(g, g), g))
                } else {
                    s.sub(zero, g)
                };
                let e = s.exp(minus_z);
                s.store(
                    o.as_mut_ptr().wrapping_add(i),
                    s.div(s.mul(g, u), s.add(one, e)),
                );
            }
            i += S::LANES;
        }
        for ((o, &g), &u) in o[i..].iter_mut().zip(&gate[i..]).zip(&up[i..]) {
            *o = if GELU { gelu_tanh(g) } else { silu(g) } * u;
        }
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

/// `v · (1 + tanh(sqrt(2/π)·(v + 0.044715·v³))) / 2`, computed as `v · sigmoid(2u)`.
#[inline]
pub fn gelu_tanh(v: f32) -> f32 {
    let u = GELU_CUBIC * v * (v * v) + v;
    v / (1.0 + (-2.0 * SQRT_2_OVER_PI * u).exp())
}

/// Scalar twin of [`gelu_tanh_and_mul`].
pub fn gelu_tanh_and_mul_scalar(x: &[f32], out: &mut [f32], d: usize) {
    gated_scalar(x, out, d, gelu_tanh);
}

/// `out = act(gate) * up`, row by row, one element at a time.
fn gated_scalar(x: &[f32], out: &mut [f32], d: usize, act: fn(f32) -> f32) {
    check_shapes(x, out, d);
    if d == 0 {
        return;
    }
    for (row, o) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
        let (gate, up) = row.split_at(d);
        for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
            *o = act(g) * u;
        }
    }
}

fn check_shapes(x: &[f32], out: &[f32], d: usize) {
    assert!(
        d > 0 || (x.is_empty() && out.is_empty()),
        "gated activation: d must be positive"
    );
    assert_eq!(
        x.len(),
        2 * out.len(),
        "gated activation: x must be [rows, 2*d], out [rows, d]"
    );
    assert_eq!(
        out.len() % d.max(1),
        0,
        "gated activation: out is not whole rows of d={d}"
    );
}

/// `1 / (1 + e^-v)`: gates (Qwen2-MoE's shared expert, Gated DeltaNet's write strength,
/// Qwen3.5's attention output).
#[inline]
pub fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// `v · sigmoid(v)`.
#[inline]
pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// Scalar twin of [`silu_and_mul`].
pub fn silu_and_mul_scalar(x: &[f32], out: &mut [f32], d: usize) {
    gated_scalar(x, out, d, silu);
}

/// gpt-oss's clamped SwiGLU (llama.cpp's `swiglu_oai`) for rows `[gate(d) | up(d)]`:
/// `out = (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`.
/// Plain code: it runs on a few thousand values per token beside matrices of millions.
pub fn swiglu_oai_and_mul(x: &[f32], out: &mut [f32], d: usize, alpha: f32, limit: f32) {
    check_shapes(x, out, d);
    if d == 0 {
        return;
    }
    let rows = |x: &[f32], out: &mut [f32]| {
        for (row, o) in x.chunks_exact(2 * d).zip(out.chunks_exact_mut(d)) {
            let (gate, up) = row.split_at(d);
            for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                // NaN stays NaN through `min`/`clamp` only if written this way round.
                let g = if g > limit { limit } else { g };
                let u = u.clamp(-limit, limit);
                *o = (u + 1.0) * (g / (1.0 + (-alpha * g).exp()));
            }
        }
    };
    if out.len() < PAR_MIN_ELEMS || rayon::current_num_threads() == 1 {
        return rows(x, out);
    }
    let chunk = (PAR_MIN_ELEMS / 4).div_ceil(d);
    out.par_chunks_mut(chunk * d)
        .zip(x.par_chunks(2 * chunk * d))
        .for_each(|(o, x)| rows(x, o));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    /// gpt-oss's SwiGLU against its definition in f64 (transformers' `_apply_gate`), on
    /// inputs past the clamps on both sides.
    #[test]
    fn swiglu_oai_clamps_then_gates() {
        let (alpha, limit) = (1.702, 7.0);
        let mut r = rng(17);
        let (rows, d) = (3, 29);
        let x: Vec<f32> = rand_vec(&mut r, rows * 2 * d)
            .iter()
            .map(|v| v * 12.0)
            .collect();
        assert!(x.iter().any(|&v| v > limit) && x.iter().any(|&v| v < -limit));
        let mut out = vec![0.0; rows * d];
        swiglu_oai_and_mul(&x, &mut out, d, alpha, limit);
        let want: Vec<f32> = (0..rows * d)
            .map(|i| {
                let (row, c) = (i / d, i % d);
                let g = f64::from(x[row * 2 * d + c]).min(f64::from(limit));
                let u = f64::from(x[row * 2 * d + d + c]).clamp(-7.0, 7.0);
                let glu = g / (1.0 + (-f64::from(alpha) * g).exp());
                ((u + 1.0) * glu) as f32
            })
            .collect();
        assert_close(&out, &want, 1e-5, 1e-5, "swiglu_oai against the definition");
    }

    /// A scalar kernel against its activation's definition in f64, on inputs in ±`range`.
    fn check_definition(
        scalar: Kernel,
        act: fn(f64) -> f64,
        seed: u64,
        range: f32,
        (atol, rtol): (f32, f32),
    ) {
        let mut r = rng(seed);
        let (rows, d) = (3, 13);
        let x: Vec<f32> = rand_vec(&mut r, rows * 2 * d)
            .iter()
            .map(|v| v * range)
            .collect();
        let mut out = vec![0.0; rows * d];
        scalar(&x, &mut out, d);
        let want: Vec<f32> = (0..rows * d)
            .map(|i| {
                let (row, c) = (i / d, i % d);
                (act(x[row * 2 * d + c] as f64) * x[row * 2 * d + d + c] as f64) as f32
            })
            .collect();
        assert_close(&out, &want, atol, rtol, "scalar against the definition");
    }

    #[test]
    fn scalar_matches_reference() {
        let silu = |g: f64| g / (1.0 + (-g).exp());
        check_definition(silu_and_mul_scalar, silu, 4, 20.0, (1e-6, 1e-6));
    }

    type Kernel = fn(&[f32], &mut [f32], usize);

    /// The dispatched kernel against its scalar twin, on shapes that take the threaded
    /// split (50 rows of 1536 and 2048) and on an input far in the left tail.
    fn check_dispatch(kernel: Kernel, scalar: Kernel, seed: u64, atol: f32, rtol: f32) {
        let mut r = rng(seed);
        for &(rows, d) in &[(1, 1), (3, 13), (2, 1536), (50, 1536), (50, 2048), (7, 9)] {
            let mut x: Vec<f32> = rand_vec(&mut r, rows * 2 * d)
                .iter()
                .map(|v| v * 30.0)
                .collect();
            x[0] = -1000.0;
            let mut want = vec![0.0; rows * d];
            scalar(&x, &mut want, d);
            let mut got = vec![f32::NAN; rows * d];
            kernel(&x, &mut got, d);
            assert_close(&got, &want, atol, rtol, "dispatched against scalar");
        }
    }

    #[test]
    fn dispatch_matches_scalar() {
        check_dispatch(silu_and_mul, silu_and_mul_scalar, 41, 1e-30, 1e-6);
    }

    #[test]
    fn gelu_tanh_matches_its_definition() {
        let gelu = |g: f64| {
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            0.5 * g * (1.0 + inner.tanh())
        };
        check_definition(gelu_tanh_and_mul_scalar, gelu, 5, 12.0, (1e-6, 1e-5));
        assert_eq!(gelu_tanh(-1000.0), -0.0);
        assert_eq!(gelu_tanh(1000.0), 1000.0);
    }

    #[test]
    fn gelu_dispatch_matches_scalar() {
        // Far left, exp(-2u) amplifies the rounding of u (a relative 1e-7 of 80 moves e by
        // 8e-6), where outputs are below 1e-9; elsewhere they agree to a few ulps.
        check_dispatch(gelu_tanh_and_mul, gelu_tanh_and_mul_scalar, 42, 1e-9, 4e-6);
    }

    /// The in-place SiLU against its scalar twin, tails and a ragged end included.
    #[test]
    fn silu_inplace_matches_scalar() {
        let mut r = rng(43);
        for n in [1, 7, 8, 37, 6144] {
            let mut x: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 30.0).collect();
            x[0] = -1000.0;
            x[n - 1] = 1000.0;
            let mut want = x.clone();
            silu_inplace_scalar(&mut want);
            silu_inplace(&mut x);
            assert_close(&x, &want, 1e-30, 1e-6, "dispatched against scalar");
        }
    }

    #[test]
    fn extreme_inputs_stay_finite() {
        assert_eq!(silu(-1000.0), -0.0);
        assert_eq!(silu(1000.0), 1000.0);
        assert_eq!(silu(0.0), 0.0);
    }
}
