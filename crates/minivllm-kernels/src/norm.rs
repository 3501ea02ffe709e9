//! RMSNorm.

/// Each row `r` of `x` (rows of `weight.len()`): `out = r / sqrt(mean(r²) + eps) * weight`.
pub fn rms_norm(_x: &[f32], _weight: &[f32], _eps: f32, _out: &mut [f32]) {
    unimplemented!("kernels helper")
}

/// Row-wise: `residual += x; x = rms_norm(residual) * weight` (vLLM's fused_add_rms_norm).
pub fn fused_add_rms_norm(_x: &mut [f32], _residual: &mut [f32], _weight: &[f32], _eps: f32) {
    unimplemented!("kernels helper")
}
