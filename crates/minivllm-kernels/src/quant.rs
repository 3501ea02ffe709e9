//! GGML block quantisation: the formats, ggml's reference arithmetic, and the kernels that
//! multiply by weights kept in their blocks.
//!
//! Laid out by concept, each module importing only those above it in this list, so that
//! any of them can be read (and changed) knowing only what it builds on:
//! - [`formats`]: the block formats' ids and sizes, and the formats the kernels compute on
//!   as zero-sized types;
//! - [`kquants`]: K-quant super-blocks decoded into plain fields and encoded back;
//! - [`dequant`]: blocks to f32 ([`dequantize`]), as ggml does;
//! - [`reference`]: ggml's scalar quantisers and dot products, the twins of the kernels;
//! - `layout`: a weight matrix rearranged for the kernels ([`QuantMatrix`]);
//! - `kernel`: which integer kernel this CPU runs ([`QKernel`]);
//! - `activations`: activation rows quantised to 8-bit blocks, once per product;
//! - `tiles`: the x86 tiles, their per-format code shared by the 256-bit (`tiles::avx2`)
//!   and 512-bit (`tiles::avx512`) registers;
//! - [`matmul`]: the product itself ([`matmul_quant`]), threaded, with its portable and
//!   scalar twins.

pub mod dequant;
pub mod formats;
pub mod kquants;
pub mod matmul;
pub mod reference;

mod activations;
mod kernel;
mod layout;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub use dequant::{dequantize, dequantize_serial, QuantError};
pub use formats::{GgmlType, QK, QK_K};
pub use matmul::{matmul_quant, matmul_quant_scalar, QKernel, QuantMatrix, QuantMatrixError};
