//! CPU kernels for mini-vllm.
//!
//! Every `unsafe`/SIMD routine of the project lives in this crate. Each public kernel
//! dispatches at run time (see [`cpu`]) to the best instruction set the machine has and
//! keeps a safe scalar twin (`*_scalar`) that tests compare it against.
//!
//! Layout conventions shared by all kernels (row-major, f32):
//! - activations: `[num_tokens, dim]`
//! - linear weights: `[out_features, in_features]` (PyTorch layout), `y = x · Wᵀ`
//! - q/k: `[num_tokens, num_heads, head_dim]`
//! - KV cache (one layer, keys and values separately): `[num_blocks, num_kv_heads, block_size, head_dim]`

// Without SIMD tokens (non-x86 targets) the element-wise kernels run their scalar twins, so
// their generic SIMD bodies and some helpers are compiled but never instantiated.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

pub mod activation;
pub mod amx;
pub mod argmax;
pub mod attention;
pub mod conv1d;
pub mod cpu;
pub mod gated_delta;
pub mod hmatmul;
pub mod matmul;
pub mod norm;
pub mod probe;
pub mod quant;
pub mod rope;
mod simd;
pub mod softmax;
pub mod threading;

#[cfg(test)]
pub(crate) mod testutil;

// The quantised modules' earlier paths, which the engine and the examples use.
pub use quant::kquants;
pub use quant::matmul as qmatmul;
pub use quant::reference as qdot;
