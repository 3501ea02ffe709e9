//! ggml's reference arithmetic for dot products of quantised weight rows with 8-bit
//! activation rows: activations are quantised to blocks of 32 (`quantize_row_q8_*_ref`),
//! and a block's dot product is an integer sum scaled by both blocks' factors
//! (`ggml_vec_dot_*_generic`, `ggml-quants.c`). The fast kernels ([`crate::qmatmul`]) compute
//! the same integer sums exactly, so they differ from these twins only in the order of the
//! float additions.

use half::f16;

use crate::quant::{f16_at, GgmlType};

/// Elements per block of every format here.
pub const QK: usize = 32;

/// One activation block, quantised as ggml's Q8_1 (which is Q8_0 plus `s`): `x ≈ d · qs`.
/// `d` is rounded to f16 as ggml stores it, but kept as f32 so that kernels need no
/// conversion. `s` is `d · Σ qs` exactly, where ggml rounds it to f16 too: Q4_1's offset term
/// `m · s` then equals the offset applied to the block's dequantised values.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct BlockQ8 {
    pub d: f32,
    /// `d · Σ qs`, the block's sum, which Q4_1's offset `m` multiplies.
    pub s: f32,
    pub qs: [i8; QK],
}

impl Default for BlockQ8 {
    fn default() -> Self {
        Self {
            d: 0.0,
            s: 0.0,
            qs: [0; QK],
        }
    }
}

/// Weight formats with a quantised dot product here.
pub fn has_dot(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantises `x` (a multiple of 32 long) into `out` as ggml's `quantize_row_q8_1_ref`
/// (but for `s`, see [`BlockQ8`]).
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_row_q8: length");
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        *yb = quantize_block(xb);
    }
}

/// One block of [`quantize_row_q8`].
#[inline]
pub fn quantize_block(xb: &[f32]) -> BlockQ8 {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut b = BlockQ8::default();
    let mut sum = 0i32;
    for (q, &v) in b.qs.iter_mut().zip(xb) {
        *q = (v * id).round() as i8;
        sum += *q as i32;
    }
    b.d = round_f16(d);
    b.s = sum as f32 * b.d;
    b
}

/// Quantises `x` (a multiple of 32 long) to Q8_0 blocks as stored in GGUF files
/// (ggml's `quantize_row_q8_0_ref`): for `--quantization q8_0`.
pub fn quantize_q8_0(x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK), "quantize_q8_0: length");
    let mut blocks = vec![BlockQ8::default(); x.len() / QK];
    quantize_row_q8(x, &mut blocks);
    let mut out = Vec::with_capacity(blocks.len() * (2 + QK));
    for b in &blocks {
        out.extend_from_slice(&f16::from_f32(b.d).to_le_bytes());
        out.extend(b.qs.iter().map(|&q| q as u8));
    }
    out
}

/// `Σ w · x` for one weight row of type `ty` (whole blocks) and its activation blocks, by
/// ggml's reference formulas. Panics on a type without [`has_dot`].
pub fn vec_dot_scalar(ty: GgmlType, w: &[u8], x: &[BlockQ8]) -> f32 {
    let size = ty.type_size();
    assert_eq!(
        w.len(),
        x.len() * size,
        "vec_dot: weight row and activation blocks differ"
    );
    let mut sum = 0.0f32;
    for (wb, xb) in w.chunks_exact(size).zip(x) {
        sum += match ty {
            GgmlType::Q4_0 => {
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    let q = wb[2 + j];
                    sumi += ((q & 0x0F) as i32 - 8) * xb.qs[j] as i32;
                    sumi += ((q >> 4) as i32 - 8) * xb.qs[j + QK / 2] as i32;
                }
                sumi as f32 * (f16_at(wb, 0) * xb.d)
            }
            GgmlType::Q4_1 => {
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    let q = wb[4 + j];
                    sumi += (q & 0x0F) as i32 * xb.qs[j] as i32;
                    sumi += (q >> 4) as i32 * xb.qs[j + QK / 2] as i32;
                }
                sumi as f32 * (f16_at(wb, 0) * xb.d) + f16_at(wb, 2) * xb.s
            }
            GgmlType::Q8_0 => {
                let sumi: i32 = (0..QK)
                    .map(|j| wb[2 + j] as i8 as i32 * xb.qs[j] as i32)
                    .sum();
                sumi as f32 * (f16_at(wb, 0) * xb.d)
            }
            other => panic!("vec_dot: no quantised dot product for {other}"),
        };
    }
    sum
}
