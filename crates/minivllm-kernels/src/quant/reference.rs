//! ggml's reference arithmetic for dot products of quantised weight rows with 8-bit
//! activation rows: activations are quantised to blocks of 32 (`quantize_row_q8_*_ref`),
//! and a block's dot product is an integer sum scaled by both blocks' factors
//! (`ggml_vec_dot_*_generic`, `ggml-quants.c`). The fast kernels ([`super::matmul`]) compute
//! the same integer sums exactly, so they differ from these twins only in the order of the
//! float additions.

use half::f16;

use super::dequant::{e8m0_to_f32_half, KVALUES_MXFP4};
pub use super::formats::QK;
use super::formats::{f16_at, GgmlType};
use super::kquants;

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
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::MXFP4
    ) || kquants::is_kquant(ty)
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantises `x` (a multiple of 32 long) into `out` as ggml's `quantize_row_q8_1_ref`
/// (but for `s`, see [`BlockQ8`]).
pub fn quantize_row_q8(x: &[f32], out: &mut [BlockQ8]) {
    quantize_row_q8_shared(x, out, 1);
}

/// [`quantize_row_q8`] with one scale for every `share` blocks: that of their largest
/// magnitude (each block keeps its own copy of it). `share` = [`super::formats::QK_K`] /
/// [`QK`] is the
/// activations of the K-quants' products, as ggml quantises them to Q8_K: one scale per
/// super-block lets the kernels sum a super-block's sub-block products, each times its
/// integer sub-block scale, exactly in 32 bits and apply the floats once per super-block.
/// A trailing run of fewer than `share` blocks shares its own scale.
pub fn quantize_row_q8_shared(x: &[f32], out: &mut [BlockQ8], share: usize) {
    assert_eq!(x.len(), out.len() * QK, "quantize_row_q8: length");
    assert!(share > 0, "quantize_row_q8: share");
    for (xg, yg) in x.chunks(share * QK).zip(out.chunks_mut(share)) {
        let amax = abs_max(xg);
        for (xb, yb) in xg.chunks_exact(QK).zip(yg.iter_mut()) {
            *yb = quantize_block_scaled(xb, amax);
        }
    }
}

/// The largest magnitude in `x` (NaN ignored, as `f32::max` does).
pub(crate) fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

/// One block of [`quantize_row_q8`].
#[inline]
pub fn quantize_block(xb: &[f32]) -> BlockQ8 {
    quantize_block_scaled(xb, abs_max(xb))
}

/// One block quantised against `amax` (its own largest magnitude, or its super-block's).
#[inline]
pub(crate) fn quantize_block_scaled(xb: &[f32], amax: f32) -> BlockQ8 {
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

/// Quantises `x` to GGUF blocks of `ty` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 by ggml's reference
/// quantisers,
/// K-quants by [`kquants::quantize`]): for `--quantization`. `None` if `ty` has no
/// quantiser here or `x` is not whole blocks of it.
pub fn quantize_to(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    if !x.len().is_multiple_of(ty.block_size()) {
        return None;
    }
    match ty {
        GgmlType::Q8_0 => Some(quantize_q8_0(x)),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let mut out = Vec::with_capacity(x.len() / QK * ty.type_size());
            for xb in x.chunks_exact(QK) {
                quantize_block_q4_q5(ty, xb, &mut out);
            }
            Some(out)
        }
        _ if kquants::is_kquant(ty) => Some(kquants::quantize(ty, x)),
        GgmlType::MXFP4 => Some(x.chunks_exact(QK).flat_map(quantize_block_mxfp4).collect()),
        _ => None,
    }
}

/// ggml's `quantize_row_mxfp4_ref` for one block: the scale from the largest magnitude's
/// power of two (6 = 1.5·2^2 is E2M1's largest value), each value to its nearest code (the
/// first of equals).
fn quantize_block_mxfp4(xb: &[f32]) -> [u8; 1 + QK / 2] {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0) as u8
    } else {
        0
    };
    let d = e8m0_to_f32_half(e);
    let best = |v: f32| -> u8 {
        let err = |i: usize| (f32::from(KVALUES_MXFP4[i]) * d - v).abs();
        (1..16).fold(0, |best, i| if err(i) < err(best) { i } else { best }) as u8
    };
    let mut out = [0u8; 1 + QK / 2];
    out[0] = e;
    for j in 0..QK / 2 {
        out[1 + j] = best(xb[j]) | (best(xb[j + QK / 2]) << 4);
    }
    out
}

/// One block as ggml's `quantize_row_q{4,5}_0_ref` (the value of largest magnitude maps to
/// -8 or -16) or `quantize_row_q{4,5}_1_ref` (minimum to maximum in 15 or 31 steps).
fn quantize_block_q4_q5(ty: GgmlType, xb: &[f32], out: &mut Vec<u8>) {
    let five = matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1);
    let nmax: i32 = if five { 31 } else { 15 };
    let half = (nmax + 1) as f32 / 2.0;
    let (d, offset, min) = if matches!(ty, GgmlType::Q4_0 | GgmlType::Q5_0) {
        let max = xb
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        (max / -half, half + 0.5, 0.0)
    } else {
        let min = xb.iter().fold(f32::MAX, |a, &v| a.min(v));
        let max = xb.iter().fold(f32::MIN, |a, &v| a.max(v));
        ((max - min) / nmax as f32, 0.5, min)
    };
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    }
    // ggml truncates `x·id + offset` (a positive number) towards zero: rounding to nearest.
    let q: [u8; QK] =
        std::array::from_fn(|j| (((xb[j] - min) * id + offset) as i32).clamp(0, nmax) as u8);
    if five {
        let qh = (0..QK).fold(0u32, |h, j| h | (((q[j] >> 4) & 1) as u32) << j);
        out.extend_from_slice(&qh.to_le_bytes());
    }
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4)));
}

/// `Σ w · x` for one weight row of type `ty` (whole blocks) and its activation blocks, by
/// ggml's reference formulas. Panics on a type without [`has_dot`].
///
/// K-quants meet activation blocks of 32 here too (ggml pairs them with Q8_K's blocks of
/// 256): each block of 32 takes its sub-block's scale (and minimum), `d·sc·Σ q·y·d_x -
/// dmin·m·s_x`, or for Q6_K two halves of 16, `d·sc·Σ (q - 32)·y·d_x`.
pub fn vec_dot_scalar(ty: GgmlType, w: &[u8], x: &[BlockQ8]) -> f32 {
    let size = ty.type_size();
    let per_block = ty.block_size() / QK;
    assert_eq!(
        w.len() * per_block,
        x.len() * size,
        "vec_dot: weight row and activation blocks differ"
    );
    if kquants::is_kquant(ty) {
        return w
            .chunks_exact(size)
            .zip(x.chunks_exact(per_block))
            .map(|(wb, xb)| vec_dot_k(ty, &kquants::decode(ty, wb), xb))
            .sum();
    }
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
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                // d, (m,) qh: the fifth bits of values 0..32, qs: their nibbles as Q4's.
                let at = if ty == GgmlType::Q5_1 { 4 } else { 2 };
                let qh = u32::from_le_bytes(wb[at..at + 4].try_into().expect("4 bytes"));
                let offset = if ty == GgmlType::Q5_0 { 16 } else { 0 };
                let q = |l: usize| {
                    let b = wb[at + 4 + l % (QK / 2)];
                    let low = if l < QK / 2 { b & 0x0F } else { b >> 4 };
                    (low as i32 | (((qh >> l) & 1) as i32) << 4) - offset
                };
                let sumi: i32 = (0..QK).map(|l| q(l) * xb.qs[l] as i32).sum();
                let m = if ty == GgmlType::Q5_1 {
                    f16_at(wb, 2) * xb.s
                } else {
                    0.0
                };
                sumi as f32 * (f16_at(wb, 0) * xb.d) + m
            }
            GgmlType::Q8_0 => {
                let sumi: i32 = (0..QK)
                    .map(|j| wb[2 + j] as i8 as i32 * xb.qs[j] as i32)
                    .sum();
                sumi as f32 * (f16_at(wb, 0) * xb.d)
            }
            // ggml's `ggml_vec_dot_mxfp4_q8_0`: doubled E2M1 values, the scale halved.
            GgmlType::MXFP4 => {
                let mut sumi = 0i32;
                for j in 0..QK / 2 {
                    let q = wb[1 + j];
                    sumi += i32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]) * xb.qs[j] as i32;
                    sumi +=
                        i32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * xb.qs[j + QK / 2] as i32;
                }
                sumi as f32 * (e8m0_to_f32_half(wb[0]) * xb.d)
            }
            other => panic!("vec_dot: no quantised dot product for {other}"),
        };
    }
    sum
}

/// One K-quant block against its 8 activation blocks.
fn vec_dot_k(ty: GgmlType, k: &kquants::KBlock, x: &[BlockQ8]) -> f32 {
    let d = k.d.to_f32();
    let mut sum = 0.0f32;
    for (t, xb) in x.iter().enumerate() {
        let q = &k.q[t * QK..(t + 1) * QK];
        if ty == GgmlType::Q6_K {
            for h in 0..2 {
                let sumi: i32 = (16 * h..16 * h + 16)
                    .map(|l| (q[l] as i32 - 32) * xb.qs[l] as i32)
                    .sum();
                let sc = k.sc[2 * t + h] as i8 as f32;
                sum += sumi as f32 * (d * sc * xb.d);
            }
        } else {
            let sumi: i32 = (0..QK).map(|l| q[l] as i32 * xb.qs[l] as i32).sum();
            let (d1, m1) = (d * k.sc[t] as f32, k.dmin.to_f32() * k.m[t] as f32);
            sum += sumi as f32 * (d1 * xb.d) - m1 * xb.s;
        }
    }
    sum
}
