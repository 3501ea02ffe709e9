//! The building blocks of a LLaMA-family decoder, each a thin owner of weights over a kernel.

pub mod attention;
pub mod linear;
pub mod norm;
pub mod rotary;
pub mod sampler;
