//! Dense f32 matrix multiplication for linear layers.

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`, threaded over the output columns.
pub fn matmul(_x: &[f32], _w: &[f32], _out: &mut [f32], _m: usize, _k: usize, _n: usize) {
    unimplemented!("kernels helper")
}
