//! The building blocks of a LLaMA-family decoder, each a thin owner of weights over a kernel.

pub(crate) mod attention;
pub(crate) mod fused_moe;
pub(crate) mod gated_delta_net;
pub(crate) mod linear;
pub(crate) mod mlp;
pub(crate) mod norm;
pub(crate) mod parallel;
pub(crate) mod per_layer_input;
pub(crate) mod rotary;
pub(crate) mod sampler;
