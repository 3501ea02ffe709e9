//! Dense f32 matrix multiplication for linear layers.

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`, threaded over the output columns.
pub fn matmul(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    matmul_scalar(x, w, out, m, k, n);
}

fn check_shapes(x: &[f32], w: &[f32], out: &[f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "matmul: x must be [m={m}, k={k}]");
    assert_eq!(w.len(), n * k, "matmul: w must be [n={n}, k={k}]");
    assert_eq!(out.len(), m * n, "matmul: out must be [m={m}, n={n}]");
}

/// Single-threaded reference for [`matmul`].
pub fn matmul_scalar(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    check_shapes(x, w, out, m, k, n);
    if k == 0 {
        out.fill(0.0);
        return;
    }
    for (xr, orow) in x.chunks_exact(k).zip(out.chunks_exact_mut(n.max(1))) {
        for (o, wr) in orow.iter_mut().zip(w.chunks_exact(k)) {
            *o = dot_scalar(xr, wr);
        }
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

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum();
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    #[test]
    fn scalar_matches_f64_reference() {
        let mut r = rng(1);
        for &(m, k, n) in &[(1, 1, 1), (1, 7, 3), (3, 17, 5), (4, 64, 9)] {
            let x = rand_vec(&mut r, m * k);
            let w = rand_vec(&mut r, n * k);
            let mut out = vec![0.0; m * n];
            matmul_scalar(&x, &w, &mut out, m, k, n);
            let tol = 1e-5 * (k as f32).sqrt();
            assert_close(&out, &reference(&x, &w, m, k, n), tol, tol, "matmul_scalar");
        }
    }

    #[test]
    fn empty_shapes_do_not_panic() {
        let mut out = vec![1.0; 6];
        matmul(&[], &[], &mut out, 2, 0, 3);
        assert!(out.iter().all(|&v| v == 0.0));
        matmul(&[], &[0.0; 4], &mut [], 0, 2, 2);
        matmul(&[0.0; 4], &[], &mut [], 2, 2, 0);
    }
}
