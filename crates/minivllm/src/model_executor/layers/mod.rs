//! The building blocks of a LLaMA-family decoder, each a thin owner of weights over a kernel.

pub mod attention;
pub mod fused_moe;
pub mod gated_delta_net;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod parallel;
pub mod rotary;
pub mod sampler;
