//! The library's integration tests, in one binary: each file's own binary would be linked
//! against the whole library at opt-level 3 again, and would run only after the previous
//! one finished, while one binary runs all tests side by side. (`fuzz.rs` stays apart: it
//! counts every allocation of its process.)

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod batch_invariance;
mod embeddings;
mod engine;
mod family_gguf;
mod gemma4_gguf;
mod gguf_dequant;
mod gguf_model;
mod hf_folder;
mod layers;
mod linear_attention;
mod model_families;
mod model_reference;
mod moe_gguf;
mod pd_disaggregation;
mod public_modules;
mod real_models;
mod scheduler;
mod speculative;
mod step_seams;
mod structured_output;
mod tensor_parallel;
mod tiny_models;
