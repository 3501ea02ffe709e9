//! Dequantisation of GGML blocks to f32.
//!
//! Block layouts and arithmetic follow ggml's reference `dequantize_row_*` functions
//! (`ggml-quants.c`) operation for operation, so results are bit-identical to ggml's and
//! to gguf-py's `gguf.quants.dequantize`. Every block is little-endian; `d`/`dmin`/`m`
//! scales are f16 except in Q8_K, whose `d` is f32.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;

use super::formats::{f16_at, GgmlType, QK_K};
use super::kquants;

/// Why [`dequantize`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("no dequantizer for tensor type {0} (id {id})", id = .0.id())]
    Unsupported(GgmlType),
    #[error("{ty}: {bytes} bytes is not a whole number of {type_size}-byte blocks", type_size = .ty.type_size())]
    PartialBlock { ty: GgmlType, bytes: usize },
    #[error("{ty}: {bytes} bytes hold {expected} values but the output has room for {out}")]
    LengthMismatch {
        ty: GgmlType,
        bytes: usize,
        expected: usize,
        out: usize,
    },
}

/// Dequantises `bytes`, a whole number of `ty` blocks, into `out`, which must hold exactly
/// the elements they encode. Large inputs are split over the rayon pool.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dequantize_with(ty, bytes, out, true)
}

/// [`dequantize`] on the calling thread alone: for kernels that are already one task of a
/// parallel split.
pub fn dequantize_serial(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    dequantize_with(ty, bytes, out, false)
}

fn dequantize_with(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
    parallel: bool,
) -> Result<(), QuantError> {
    if !ty.can_dequantize() {
        return Err(QuantError::Unsupported(ty));
    }
    let (_, block, size) = ty.traits();
    if !bytes.len().is_multiple_of(size) {
        return Err(QuantError::PartialBlock {
            ty,
            bytes: bytes.len(),
        });
    }
    let expected = bytes.len() / size * block;
    if out.len() != expected {
        return Err(QuantError::LengthMismatch {
            ty,
            bytes: bytes.len(),
            expected,
            out: out.len(),
        });
    }
    let b = Blocks { parallel };
    use GgmlType::*;
    match ty {
        F32 => b.run::<4, 1>(bytes, out, |b, y| y[0] = f32::from_le_bytes(*b)),
        F16 => dequant_f16(b, bytes, out),
        BF16 => b.run::<2, 1>(bytes, out, |b, y| y[0] = bf16::from_le_bytes(*b).to_f32()),
        Q4_0 => b.run(bytes, out, block_q4_0),
        Q4_1 => b.run(bytes, out, block_q4_1),
        Q5_0 => b.run(bytes, out, block_q5_0),
        Q5_1 => b.run(bytes, out, block_q5_1),
        Q8_0 => b.run(bytes, out, block_q8_0),
        Q2_K => b.run(bytes, out, block_q2_k),
        Q3_K => b.run(bytes, out, block_q3_k),
        Q4_K => b.run(bytes, out, block_q4_k),
        Q5_K => b.run(bytes, out, block_q5_k),
        Q6_K => b.run(bytes, out, block_q6_k),
        Q8_K => b.run(bytes, out, block_q8_k),
        MXFP4 => b.run(bytes, out, block_mxfp4),
        _ => return Err(QuantError::Unsupported(ty)),
    }
    Ok(())
}

/// MXFP4's E2M1 values, doubled (ggml's `kvalues_mxfp4`): the block scale is then half
/// its power of two.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of 2^(e - 127), ggml's `ggml_e8m0_to_fp32_half` (exact for every byte: the two
/// smallest are subnormal).
pub(crate) fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// MXFP4 (gpt-oss's experts): an E8M0 scale byte, then 32 E2M1 values as nibbles,
/// elements 0-15 in the low nibbles and 16-31 in the high ones.
fn block_mxfp4(b: &[u8; 17], y: &mut [f32; 32]) {
    let d = e8m0_to_f32_half(b[0]);
    for (j, &q) in b[1..].iter().enumerate() {
        y[j] = d * f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(KVALUES_MXFP4[usize::from(q >> 4)]);
    }
}

/// Inputs below this size are not worth waking the pool for.
const PAR_MIN_BYTES: usize = 256 * 1024;
/// Input bytes per parallel task: big enough to amortise scheduling, small enough to
/// balance a few hundred KiB over all cores.
const TASK_BYTES: usize = 32 * 1024;

/// How [`dequantize_with`] walks the blocks: split over the pool, or on this thread.
#[derive(Clone, Copy)]
struct Blocks {
    parallel: bool,
}

impl Blocks {
    /// Runs `f` on each `TS`-byte block of `bytes` and its `BS` outputs. Callers have
    /// checked that `bytes` and `out` hold the same whole number of blocks.
    fn run<const TS: usize, const BS: usize>(
        self,
        bytes: &[u8],
        out: &mut [f32],
        f: impl Fn(&[u8; TS], &mut [f32; BS]) + Sync,
    ) {
        let serial = |bytes: &[u8], out: &mut [f32]| {
            for (b, y) in bytes.chunks_exact(TS).zip(out.chunks_exact_mut(BS)) {
                // The chunk lengths are exact, so these conversions cannot fail; fixed-size
                // arrays let the compiler drop every bounds check inside `f`.
                f(b.try_into().unwrap(), y.try_into().unwrap());
            }
        };
        if !self.parallel || bytes.len() < PAR_MIN_BYTES {
            serial(bytes, out);
            return;
        }
        let blocks_per_task = (TASK_BYTES / TS).max(1);
        bytes
            .par_chunks(blocks_per_task * TS)
            .zip(out.par_chunks_mut(blocks_per_task * BS))
            .for_each(|(b, y)| serial(b, y));
    }
}

/// F16 goes through `half`'s slice conversion, which uses F16C when the CPU has it.
fn dequant_f16(blocks: Blocks, bytes: &[u8], out: &mut [f32]) {
    const LANES: usize = 64;
    let head = out.len() / LANES * LANES;
    let (head_bytes, tail_bytes) = bytes.split_at(head * 2);
    let (head_out, tail_out) = out.split_at_mut(head);
    blocks.run::<{ 2 * LANES }, LANES>(head_bytes, head_out, |b, y| {
        let h: [f16; LANES] = std::array::from_fn(|i| f16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
        h.convert_to_f32_slice(y);
    });
    for (b, y) in tail_bytes.chunks_exact(2).zip(tail_out) {
        *y = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

// Q4_0: d, then 16 bytes whose low nibbles are elements 0..16 and high nibbles 16..32.
#[inline(always)]
fn block_q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

#[inline(always)]
fn block_q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        y[j] = (q & 0x0F) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// The 5-bit values of a Q5_0/Q5_1 block: the nibbles as in Q4_0, and bit `j` of the
/// little-endian u32 `qh` is bit 4 of element `j`.
#[inline(always)]
fn q5_values(qh: [u8; 4], qs: &[u8], y: &mut [f32; 32], f: impl Fn(i32) -> f32) {
    let qh = u32::from_le_bytes(qh);
    for (j, &q) in qs.iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = f(((q & 0x0F) as u32 | h0) as i32);
        y[j + 16] = f(((q >> 4) as u32 | h1) as i32);
    }
}

#[inline(always)]
fn block_q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    q5_values([b[2], b[3], b[4], b[5]], &b[6..], y, |q| {
        (q - 16) as f32 * d
    });
}

#[inline(always)]
fn block_q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    q5_values([b[4], b[5], b[6], b[7]], &b[8..], y, |q| q as f32 * d + m);
}

#[inline(always)]
fn block_q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..]) {
        *y = q as i8 as f32 * d;
    }
}

// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin. Each 128-element
// half reads 32 qs bytes four times, two bits deeper each pass, 16 elements per scale.
#[inline(always)]
fn block_q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for pass in 0..4 {
            let shift = 2 * pass;
            for sub in 0..2 {
                let sc = scales[8 * half + 2 * pass + sub];
                let dl = d * (sc & 0x0F) as f32;
                let ml = dmin * (sc >> 4) as f32;
                let base = 128 * half + 32 * pass + 16 * sub;
                for l in 0..16 {
                    y[base + l] = dl * ((q[16 * sub + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

// Q3_K: hmask[32], qs[64], scales[12], d. Same walk as Q2_K; the high bit comes from
// hmask (one bit plane per pass) and a *clear* bit subtracts 4. The sixteen 6-bit scales
// keep their low nibbles in bytes 0..8 (low then high nibble) and their top two bits in
// bytes 8..12, two bits per scale.
#[inline(always)]
fn block_q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let (hmask, qs, sc) = (&b[..32], &b[32..96], &b[96..108]);
    let d_all = f16_at(b, 108);
    let scale = |j: usize| {
        let low = (sc[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        (low | (high << 4)) as i32 - 32
    };
    for half in 0..2 {
        let q = &qs[32 * half..32 * half + 32];
        for pass in 0..4 {
            let shift = 2 * pass;
            let m = 1u8 << (4 * half + pass);
            for sub in 0..2 {
                let dl = d_all * scale(8 * half + 2 * pass + sub) as f32;
                let base = 128 * half + 32 * pass + 16 * sub;
                for l in 0..16 {
                    let i = 16 * sub + l;
                    let low = ((q[i] >> shift) & 3) as i32;
                    let offset = if hmask[i] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * (low - offset) as f32;
                }
            }
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block, as f32.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    let (sc, m) = kquants::unpack_scale_min(j, q);
    (sc as f32, m as f32)
}

// Q4_K: d, dmin, scales[12], qs[128]. Each 64-element chunk reads 32 qs bytes: low
// nibbles with one scale/min pair, then high nibbles with the next.
#[inline(always)]
fn block_q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..]);
    for chunk in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1, d2, m2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        let q = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            y[64 * chunk + l] = d1 * (q[l] & 0x0F) as f32 - m1;
            y[64 * chunk + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

// Q5_K: Q4_K plus qh[32] before qs; chunk c takes its fifth bits from bits 2c and 2c+1.
#[inline(always)]
fn block_q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..]);
    for chunk in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * chunk, scales);
        let (sc2, m2) = scale_min_k4(2 * chunk + 1, scales);
        let (d1, m1, d2, m2) = (d * sc1, dmin * m1, d * sc2, dmin * m2);
        let (u1, u2) = (1u8 << (2 * chunk), 2u8 << (2 * chunk));
        let q = &qs[32 * chunk..32 * chunk + 32];
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[64 * chunk + l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
            y[64 * chunk + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

// Q6_K: ql[128], qh[64], scales[16] (i8), d. Each 128-element half uses 64 ql bytes (low
// nibbles for its first 64 elements, high nibbles for the next) and 32 qh bytes holding
// two high bits for each of four elements 32 apart.
#[inline(always)]
fn block_q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..64 * half + 64];
        let qh = &b[128 + 32 * half..128 + 32 * half + 32];
        let sc = &b[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut y[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * sc[is] as i8 as f32 * q1 as f32;
            out[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            out[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            out[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

// Q8_K: f32 d, qs[256] (i8), then 16 i16 block sums that only dot products use.
#[inline(always)]
fn block_q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (y, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *y = q as i8 as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn deq(ty: GgmlType, bytes: &[u8]) -> Vec<f32> {
        let mut out = vec![f32::NAN; bytes.len() / ty.type_size() * ty.block_size()];
        dequantize(ty, bytes, &mut out).unwrap();
        out
    }

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_id(id), None, "id {id}");
        }
        assert_eq!(GgmlType::from_id(30), Some(GgmlType::BF16));
        assert_eq!(GgmlType::Q3_K.to_string(), "Q3_K");
    }

    #[test]
    fn block_sizes_match_ggml() {
        use GgmlType::*;
        let expect = [
            (F32, 1, 4),
            (F16, 1, 2),
            (BF16, 1, 2),
            (Q4_0, 32, 18),
            (Q4_1, 32, 20),
            (Q5_0, 32, 22),
            (Q5_1, 32, 24),
            (Q8_0, 32, 34),
            (Q8_1, 32, 36),
            (Q2_K, 256, 84),
            (Q3_K, 256, 110),
            (Q4_K, 256, 144),
            (Q5_K, 256, 176),
            (Q6_K, 256, 210),
            (Q8_K, 256, 292),
            (IQ4_XS, 256, 136),
            (MXFP4, 32, 17),
        ];
        for (ty, block, size) in expect {
            assert_eq!((ty.block_size(), ty.type_size()), (block, size), "{ty}");
        }
        assert_eq!(Q4_0.row_bytes(64), Some(36));
        assert_eq!(Q4_0.row_bytes(33), None);
        assert_eq!(F16.row_bytes(3), Some(6));
        assert_eq!(Q8_K.row_bytes(usize::MAX / 256 * 256), None);
    }

    #[test]
    fn rejects_partial_blocks_wrong_output_and_unsupported_types() {
        let mut out = vec![0.0; 32];
        let err = dequantize(GgmlType::Q4_0, &[0; 17], &mut out).unwrap_err();
        assert!(
            err.to_string()
                .contains("not a whole number of 18-byte blocks"),
            "{err}"
        );
        let err = dequantize(GgmlType::Q4_0, &[0; 36], &mut out).unwrap_err();
        assert!(
            err.to_string()
                .contains("hold 64 values but the output has room for 32"),
            "{err}"
        );
        let err = dequantize(GgmlType::IQ2_XXS, &[0; 66], &mut vec![0.0; 256]).unwrap_err();
        assert!(err.to_string().contains("IQ2_XXS (id 16)"), "{err}");
        assert!(!GgmlType::Q8_1.can_dequantize());
    }

    #[test]
    fn float_types() {
        let vals = [1.5f32, -0.0, 65504.0, 1e-7];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(deq(GgmlType::F32, &bytes), vals);
        // 200 values: both the 64-lane path and the tail.
        let halves: Vec<f16> = (0..200)
            .map(|i| f16::from_f32(i as f32 * 0.37 - 20.0))
            .collect();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        let want: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
        assert_eq!(deq(GgmlType::F16, &bytes), want);
        let bytes: Vec<u8> = [0x3F80u16, 0xC040, 0x7F80]
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        assert_eq!(deq(GgmlType::BF16, &bytes), [1.0, -3.0, f32::INFINITY]);
    }

    #[test]
    fn q4_0_and_q4_1_nibble_order() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0xF0; // element 0 = 0 - 8, element 16 = 15 - 8
        b[17] = 0x19; // element 15 = 9 - 8, element 31 = 1 - 8
        let y = deq(GgmlType::Q4_0, &b);
        assert_eq!(
            (y[0], y[16], y[15], y[31], y[1]),
            (-4.0, 3.5, 0.5, -3.5, -4.0)
        );

        let mut b = [0u8; 20];
        b[..2].copy_from_slice(&f16_bytes(2.0));
        b[2..4].copy_from_slice(&f16_bytes(-1.0));
        b[4] = 0x3A;
        let y = deq(GgmlType::Q4_1, &b);
        assert_eq!((y[0], y[16], y[1]), (19.0, 5.0, -1.0));
    }

    #[test]
    fn q5_high_bits_come_from_qh() {
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        // bit 0 -> element 0, bit 16 -> element 16, bit 31 -> element 31
        b[2..6].copy_from_slice(&(1u32 | 1 << 16 | 1 << 31).to_le_bytes());
        b[6] = 0x21;
        let y = deq(GgmlType::Q5_0, &b);
        assert_eq!((y[0], y[16], y[31], y[1]), (1.0, 2.0, 0.0, -16.0));

        let mut b = [0u8; 24];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..4].copy_from_slice(&f16_bytes(0.25));
        b[4..8].copy_from_slice(&(1u32 << 17).to_le_bytes());
        let y = deq(GgmlType::Q5_1, &b);
        assert_eq!((y[17], y[1], y[0]), (16.25, 0.25, 0.25));
    }

    #[test]
    fn q8_types_are_signed() {
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0xFF;
        b[33] = 127;
        let y = deq(GgmlType::Q8_0, &b);
        assert_eq!((y[0], y[31], y[1]), (-0.5, 63.5, 0.0));

        let mut b = [0u8; 292];
        b[..4].copy_from_slice(&0.25f32.to_le_bytes());
        b[4] = 0x80;
        b[259] = 4;
        let y = deq(GgmlType::Q8_K, &b);
        assert_eq!((y[0], y[255]), (-32.0, 1.0));
    }

    #[test]
    fn q3_k_scale_unpacking_and_high_bit() {
        let mut b = [0u8; 110];
        b[108..].copy_from_slice(&f16_bytes(1.0));
        // Scale 9 (elements 16..32 of the second half's first pass): low nibble from the
        // high nibble of byte 1, top bits from bits 4..6 of byte 8 + 9 % 4 = 9.
        b[96 + 1] = 0x50;
        b[96 + 9] = 0b10 << 4;
        // Element 128 + 16: qs byte 32 + 16, low two bits = 3, hmask bit 4 set (no -4).
        b[32 + 48] = 3;
        b[16] = 1 << 4;
        let y = deq(GgmlType::Q3_K, &b);
        // scale = (5 | 2 << 4) - 32 = 5
        assert_eq!(y[144], 15.0);
        // Element 145 has q = 0 and a clear mask bit: 5 * (0 - 4).
        assert_eq!(y[145], -20.0);
        // Element 0: scale 0 = 0 - 32, q = 0 - 4.
        assert_eq!(y[0], 128.0);
    }

    #[test]
    fn q6_k_layout() {
        let mut b = [0u8; 210];
        b[208..].copy_from_slice(&f16_bytes(0.5));
        b[192 + 8 + 6] = (-2i8) as u8; // scale of elements 224..240
        b[64 + 32] = 0x70; // ql byte 32 of the second half: high nibble -> element 128 + 96
        b[128 + 32] = 0b01 << 6; // its top two bits
        let y = deq(GgmlType::Q6_K, &b);
        // q = (7 | 1 << 4) - 32 = -9; 0.5 * -2 * -9
        assert_eq!(y[224], 9.0);
    }

    #[test]
    fn q4_k_and_q5_k_scales() {
        let mut b = [0u8; 176];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..4].copy_from_slice(&f16_bytes(0.5));
        // Sub-block 5: scale = (byte 9 & 0xF) | (byte 1 >> 6) << 4, min = (byte 9 >> 4) | (byte 5 >> 6) << 4.
        b[4 + 9] = 0x32;
        b[4 + 1] = 0b01 << 6;
        b[4 + 5] = 0b10 << 6;
        let mut q4 = b[..144].to_vec();
        q4[16 + 64] = 0x70; // chunk 2, l = 0, high nibble -> element 160
        let y = deq(GgmlType::Q4_K, &q4);
        // scale 18, min 35: 18 * 7 - 0.5 * 35
        assert_eq!(y[160], 108.5);

        b[48 + 64] = 0x70;
        b[16] = 2 << 4; // qh bit 2*2+1 -> element 160 gets +16
        let y = deq(GgmlType::Q5_K, &b);
        assert_eq!(y[160], 18.0 * 23.0 - 17.5);
    }

    /// Random bytes with every f16 scale field replaced by a finite value.
    fn random_blocks(ty: GgmlType, n_blocks: usize, rng: &mut impl Rng) -> Vec<u8> {
        let scale_offsets: &[usize] = match ty {
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => unreachable!(),
        };
        let mut bytes: Vec<u8> = (0..n_blocks * ty.type_size())
            .map(|_| rng.random())
            .collect();
        for block in bytes.chunks_exact_mut(ty.type_size()) {
            for &o in scale_offsets {
                block[o..o + 2].copy_from_slice(&f16_bytes(rng.random_range(-1.0..1.0)));
            }
        }
        bytes
    }

    #[test]
    fn parallel_split_matches_block_by_block() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for ty in [
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let bytes = random_blocks(ty, 4001, &mut rng);
            assert!(bytes.len() > PAR_MIN_BYTES);
            let whole = deq(ty, &bytes);
            let mut blockwise = Vec::new();
            for block in bytes.chunks_exact(ty.type_size()) {
                blockwise.extend(deq(ty, block));
            }
            assert_eq!(whole, blockwise, "{ty}");
            assert!(whole.iter().all(|v| v.is_finite()), "{ty}");
        }
    }
}
