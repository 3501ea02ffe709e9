//! Gated activations.

/// For each row of `x` laid out as `[gate(d) | up(d)]`: `out = silu(gate) * up` (`out` rows of `d`).
pub fn silu_and_mul(x: &[f32], out: &mut [f32], d: usize) {
    silu_and_mul_scalar(x, out, d);
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
    fn extreme_inputs_stay_finite() {
        assert_eq!(silu(-1000.0), -0.0);
        assert_eq!(silu(1000.0), 1000.0);
        assert_eq!(silu(0.0), 0.0);
    }
}
