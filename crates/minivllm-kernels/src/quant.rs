//! GGML block quantisation formats and their dequantisation to f32.
