//! ggml's K-quant blocks (Q4_K, Q5_K, Q6_K: 256 values each) decoded into plain fields and
//! encoded back, and simple quantisers that write them.
//!
//! The packed bit fields differ per format (6-bit scales spread over 12 bytes, fifth and
//! sixth bits in separate planes); [`KBlock`] holds the same numbers unpacked, so that the
//! kernels' repacking, the reference dot products and the quantisers share one definition
//! of each format, and [`decode`] ∘ [`encode`] is the identity on every byte string.

use half::f16;

use super::formats::{GgmlType, QK_K};

/// One K-quant block's numbers. A value is `d·sc[j]·q - dmin·m[j]` over sub-block `j` of 32
/// (Q4_K, Q5_K), or `d·sc[j]·(q - 32)` over sub-block `j` of 16 (Q6_K, `sc` as i8).
#[derive(Clone, Debug, PartialEq)]
pub struct KBlock {
    pub d: f16,
    /// Q4_K/Q5_K's minimum scale; zero for Q6_K.
    pub dmin: f16,
    /// Unsigned quants: 0..16 (Q4_K), 0..32 (Q5_K), 0..64 (Q6_K).
    pub q: [u8; QK_K],
    /// 6-bit scales of the 8 sub-blocks (Q4_K/Q5_K, `sc[8..]` zero), or the i8 scales of
    /// the 16 sub-blocks (Q6_K).
    pub sc: [u8; 16],
    /// 6-bit minima of the 8 sub-blocks (Q4_K/Q5_K; zero for Q6_K).
    pub m: [u8; 8],
}

impl Default for KBlock {
    fn default() -> Self {
        KBlock {
            d: f16::ZERO,
            dmin: f16::ZERO,
            q: [0; QK_K],
            sc: [0; 16],
            m: [0; 8],
        }
    }
}

/// Whether `ty` is a K-quant that [`decode`] handles.
pub fn is_kquant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

impl KBlock {
    /// Value `i` (0..256) with ggml's dequantisation arithmetic (`dequantize_row_q*_K`), bit
    /// for bit.
    pub fn value(&self, ty: GgmlType, i: usize) -> f32 {
        let d = self.d.to_f32();
        if ty == GgmlType::Q6_K {
            let sc = self.sc[i / 16] as i8 as f32;
            return d * sc * (self.q[i] as i32 - 32) as f32;
        }
        let j = i / 32;
        let d1 = d * self.sc[j] as f32;
        let m1 = self.dmin.to_f32() * self.m[j] as f32;
        d1 * self.q[i] as f32 - m1
    }
}

/// The 6-bit scale and minimum of sub-block `j` from Q4_K/Q5_K's 12 packed bytes (ggml's
/// `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn unpack_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The inverse of [`unpack_scale_min`] over all eight sub-blocks.
fn pack_scales_mins(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (sc[j] & 63, m[j] & 63);
        if j < 4 {
            s[j] |= ls;
            s[j + 4] |= lm;
        } else {
            s[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            s[j - 4] |= (ls >> 4) << 6;
            s[j] |= (lm >> 4) << 6;
        }
    }
    s
}

fn f16_le(b: &[u8], at: usize) -> f16 {
    f16::from_le_bytes([b[at], b[at + 1]])
}

/// Unpacks one block of `ty` (`ty.type_size()` bytes).
///
/// # Panics
/// If `ty` is not a K-quant of [`is_kquant`] or `b` is not one block long.
pub fn decode(ty: GgmlType, b: &[u8]) -> KBlock {
    assert!(
        is_kquant(ty),
        "kquants::decode: {ty} is not Q4_K, Q5_K or Q6_K"
    );
    assert_eq!(
        b.len(),
        ty.type_size(),
        "kquants::decode: {ty} block length"
    );
    let mut k = KBlock::default();
    if ty == GgmlType::Q6_K {
        decode_q6_k(b, &mut k);
        return k;
    }
    (k.d, k.dmin) = (f16_le(b, 0), f16_le(b, 2));
    for j in 0..8 {
        (k.sc[j], k.m[j]) = unpack_scale_min(j, &b[4..16]);
    }
    let (qh, qs) = if ty == GgmlType::Q5_K {
        (Some(&b[16..48]), &b[48..])
    } else {
        (None, &b[16..])
    };
    // Chunk c of 64 values: low nibbles of qs[32c..] then high nibbles; Q5_K's fifth bits
    // are bit 2c (first half) and 2c + 1 (second half) of qh[l].
    for c in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * c + l];
            let (mut lo, mut hi) = (byte & 0x0F, byte >> 4);
            if let Some(qh) = qh {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            k.q[64 * c + l] = lo;
            k.q[64 * c + 32 + l] = hi;
        }
    }
    k
}

/// Q6_K: ql[128], qh[64], sc[16], d. Each half of 128 values reads 64 ql bytes (low nibbles
/// for its values 0..64, high nibbles for 64..128) and 32 qh bytes holding the top two bits
/// of four values 32 apart.
fn decode_q6_k(b: &[u8], k: &mut KBlock) {
    k.d = f16_le(b, 208);
    k.sc.copy_from_slice(&b[192..208]);
    for h in 0..2 {
        let (ql, qh) = (&b[64 * h..64 * h + 64], &b[128 + 32 * h..128 + 32 * h + 32]);
        for l in 0..32 {
            let at = 128 * h + l;
            k.q[at] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
            k.q[at + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
            k.q[at + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            k.q[at + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
}

/// Packs `k` as a block of `ty`, appending it to `out`; the inverse of [`decode`]. Quants
/// and scales beyond the format's bits are masked off.
pub fn encode(ty: GgmlType, k: &KBlock, out: &mut Vec<u8>) {
    assert!(
        is_kquant(ty),
        "kquants::encode: {ty} is not Q4_K, Q5_K or Q6_K"
    );
    if ty == GgmlType::Q6_K {
        return encode_q6_k(k, out);
    }
    out.extend_from_slice(&k.d.to_le_bytes());
    out.extend_from_slice(&k.dmin.to_le_bytes());
    out.extend_from_slice(&pack_scales_mins(&k.sc, &k.m));
    if ty == GgmlType::Q5_K {
        let mut qh = [0u8; 32];
        for c in 0..4 {
            for (l, h) in qh.iter_mut().enumerate() {
                *h |= ((k.q[64 * c + l] >> 4) & 1) << (2 * c);
                *h |= ((k.q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for c in 0..4 {
        out.extend(
            (0..32).map(|l| (k.q[64 * c + l] & 0x0F) | ((k.q[64 * c + 32 + l] & 0x0F) << 4)),
        );
    }
}

fn encode_q6_k(k: &KBlock, out: &mut Vec<u8>) {
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for h in 0..2 {
        for l in 0..32 {
            let q = |off: usize| k.q[128 * h + l + off];
            ql[64 * h + l] = (q(0) & 0x0F) | ((q(64) & 0x0F) << 4);
            ql[64 * h + l + 32] = (q(32) & 0x0F) | ((q(96) & 0x0F) << 4);
            qh[32 * h + l] = ((q(0) >> 4) & 3)
                | (((q(32) >> 4) & 3) << 2)
                | (((q(64) >> 4) & 3) << 4)
                | (((q(96) >> 4) & 3) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend_from_slice(&k.sc);
    out.extend_from_slice(&k.d.to_le_bytes());
}

/// Quantises `x` (a multiple of 256 long) to blocks of `ty` as stored in GGUF files, for
/// `--quantization q4_k|q5_k|q6_k`. Each sub-block's scale (and minimum) comes from its
/// range, then is itself quantised to the block's 6- or 8-bit scale steps, and each value
/// rounds to the nearest step of its sub-block's final scale. ggml's reference quantisers
/// also search scales around the range (`make_qkx2_quants`), which lowers the error a
/// little further; the blocks are the same format either way.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    assert!(
        is_kquant(ty),
        "kquants::quantize: {ty} is not Q4_K, Q5_K or Q6_K"
    );
    assert!(x.len().is_multiple_of(QK_K), "kquants::quantize: length");
    let mut out = Vec::with_capacity(x.len() / QK_K * ty.type_size());
    for xb in x.chunks_exact(QK_K) {
        let k = if ty == GgmlType::Q6_K {
            quantize_q6_k(xb)
        } else {
            quantize_min_block(xb, if ty == GgmlType::Q5_K { 31 } else { 15 })
        };
        encode(ty, &k, &mut out);
    }
    out
}

/// A Q4_K/Q5_K block: per 32 values, `x ≈ scale·q - min` with `q` in `0..=nmax`.
fn quantize_min_block(x: &[f32], nmax: u8) -> KBlock {
    let mut scale = [0.0f32; 8];
    let mut min = [0.0f32; 8];
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let lo = xs.iter().fold(0.0f32, |a, &v| a.min(v));
        let hi = xs.iter().fold(f32::MIN, |a, &v| a.max(v));
        (scale[j], min[j]) = ((hi - lo).max(0.0) / nmax as f32, -lo);
    }
    let mut k = KBlock::default();
    let (d, sc) = six_bit_steps(&scale);
    let (dmin, m) = six_bit_steps(&min);
    (k.d, k.dmin) = (d, dmin);
    k.sc[..8].copy_from_slice(&sc);
    k.m = m;
    for (j, xs) in x.chunks_exact(32).enumerate() {
        let d1 = d.to_f32() * sc[j] as f32;
        let m1 = dmin.to_f32() * m[j] as f32;
        let id = if d1 > 0.0 { 1.0 / d1 } else { 0.0 };
        for (l, &v) in xs.iter().enumerate() {
            k.q[32 * j + l] = ((v + m1) * id).round().clamp(0.0, nmax as f32) as u8;
        }
    }
    k
}

/// Non-negative `v` as an f16 step `d` and 6-bit multiples of it, the largest at 63.
fn six_bit_steps(v: &[f32; 8]) -> (f16, [u8; 8]) {
    let vmax = v.iter().fold(0.0f32, |a, &b| a.max(b));
    let d = f16::from_f32(vmax / 63.0);
    let id = if d.to_f32() > 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    (d, v.map(|s| (s * id).round().clamp(0.0, 63.0) as u8))
}

/// A Q6_K block: per 16 values, `x ≈ scale·(q - 32)` with `q - 32` in `-32..=31`.
fn quantize_q6_k(x: &[f32]) -> KBlock {
    let mut scale = [0.0f32; 16];
    for (j, xs) in x.chunks_exact(16).enumerate() {
        // The value of largest magnitude maps to -32 (whichever its sign: the scale takes
        // the sign), so the full negative range is used as ggml does.
        let big = xs
            .iter()
            .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
        scale[j] = -big / 32.0;
    }
    let smax = scale
        .iter()
        .fold(0.0f32, |a, &v| if v.abs() > a.abs() { v } else { a });
    let mut k = KBlock::default();
    let d = f16::from_f32(-smax / 128.0);
    k.d = d;
    let id = if d.to_f32() != 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    for (j, xs) in x.chunks_exact(16).enumerate() {
        let sc = (scale[j] * id).round().clamp(-128.0, 127.0) as i8;
        k.sc[j] = sc as u8;
        let d1 = d.to_f32() * sc as f32;
        let id1 = if d1 != 0.0 { 1.0 / d1 } else { 0.0 };
        for (l, &v) in xs.iter().enumerate() {
            k.q[16 * j + l] = ((v * id1).round().clamp(-32.0, 31.0) as i32 + 32) as u8;
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;
    use crate::testutil::*;
    use rand::Rng;

    const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

    /// Random bytes with finite f16 scale fields.
    fn random_block(r: &mut rand::rngs::StdRng, ty: GgmlType) -> Vec<u8> {
        let mut b: Vec<u8> = (0..ty.type_size()).map(|_| r.random()).collect();
        let scales: &[usize] = if ty == GgmlType::Q6_K {
            &[208]
        } else {
            &[0, 2]
        };
        for &at in scales {
            let v = f16::from_f32(r.random_range(-0.05f32..0.05));
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn decode_then_encode_gives_back_every_byte() {
        let mut r = rng(21);
        for ty in TYPES {
            for _ in 0..200 {
                let b = random_block(&mut r, ty);
                let mut again = Vec::new();
                encode(ty, &decode(ty, &b), &mut again);
                assert_eq!(again, b, "{ty}");
            }
        }
    }

    /// `KBlock::value` is ggml's dequantisation bit for bit (the dequantiser it is compared
    /// with is pinned to gguf-py's by `tests/integration/gguf_dequant.rs`).
    #[test]
    fn values_equal_the_dequantiser_bit_for_bit() {
        let mut r = rng(22);
        for ty in TYPES {
            let b = random_block(&mut r, ty);
            let mut want = vec![0.0; QK_K];
            quant::dequantize(ty, &b, &mut want).unwrap();
            let k = decode(ty, &b);
            for (i, w) in want.iter().enumerate() {
                assert_eq!(k.value(ty, i).to_bits(), w.to_bits(), "{ty} value {i}");
            }
        }
    }

    /// Quantised then dequantised, values come back within the format's step: a fraction of
    /// each sub-block's range, or of the block's largest magnitude for Q6_K.
    #[test]
    fn quantisers_round_trip_within_a_step() {
        let mut r = rng(23);
        let mut x = rand_vec(&mut r, 4 * QK_K);
        x[320..352].fill(0.0); // an all-zero sub-block
        x[600] = 7.0; // an outlier
        for (ty, tol) in [
            (GgmlType::Q4_K, 2.0 / 15.0),
            (GgmlType::Q5_K, 2.0 / 31.0),
            (GgmlType::Q6_K, 1.0 / 31.0),
        ] {
            let bytes = quantize(ty, &x);
            assert_eq!(bytes.len(), 4 * ty.type_size());
            let mut back = vec![0.0; x.len()];
            quant::dequantize(ty, &bytes, &mut back).unwrap();
            for (blk, (b, xs)) in back.chunks(QK_K).zip(x.chunks(QK_K)).enumerate() {
                let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                assert_close(b, xs, tol * amax, 0.0, &format!("{ty} block {blk}"));
            }
            assert!(
                back[320..352].iter().all(|&v| v.abs() < 1e-6),
                "{ty}: zeros"
            );
        }
    }
}
