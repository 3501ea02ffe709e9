//! The model families: one decoder (`llama.rs`) that each family's configuration shapes.

pub mod llama;
