//! Linear layers over weights kept in their GGML block format.
//!
//! Every row of `x` is quantised once to 8-bit blocks of 32 (ggml's Q8_0/Q8_1) and every
//! output is an integer dot product of blocks, as llama.cpp computes ([`crate::qdot`] has
//! ggml's reference formulas). Decoding a few rows is bound by reading the weights, which
//! stay 4-8x smaller than f32; many rows (prefill) run the same products in tiles (8
//! activation rows against 16 weight rows with AVX512-VNNI, 4 against 8 with 256-bit
//! registers), so that weights and activations are each unpacked once per tile.
//!
//! Weights are split at load into quants, scales and offsets; the bytes are those of the
//! file, rearranged. Every format is interleaved in groups of sixteen rows (after the
//! row-interleaved `_R8` layouts of ik_llama.cpp and llama.cpp's CPU repack): each 32-bit
//! lane of a register holds four quants of its own row, so one broadcast activation quad
//! meets sixteen rows at once in a 512-bit register (eight, taking half a group, in a
//! 256-bit one), the block's integer sums come out one row per lane with no horizontal
//! sums, and the rows' scales convert and multiply as one vector. Each group is one
//! sequential stream of memory, which is what decoding, bound by reading it, wants. (Q8_0
//! walked rows four at a time until the fifth pass: 20 % slower per byte in decode, with a
//! horizontal sum per output. Groups were eight rows until the 512-bit kernels came: their
//! registers take the two halves from one 64-byte load.)
//!
//! One path for every batch size is deliberate: each output is summed in an order that
//! depends only on its own row, so a sequence's logits are bit-for-bit the same whatever
//! else is batched with it. (An f32 path for large batches would be faster on AVX2, but it
//! would differ from this one by rounding, and 8-bit rounding of the next layer's inputs
//! amplifies such differences into different greedy tokens.)

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;

use crate::kquants::{self, KBlock};
use crate::matmul::rows_per_task;
use crate::qdot::{self, BlockQ8, QK};
use crate::quant::{GgmlType, QK_K};

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod int_dot;
mod kernels;
#[cfg(target_arch = "x86_64")]
mod x86;

use activations::Q8Rows;
#[cfg(target_arch = "x86_64")]
use activations::RowSums;
pub use kernels::QKernel;

/// Activation rows per 256-bit tile (each against `LANES` weight rows).
const TILE_R: usize = 4;
/// Activation rows per 512-bit tile: AVX-512's 32 registers hold eight accumulators beside
/// a block's eight weight vectors, and each weight vector then meets twice the rows (Q4_1,
/// 16-512 rows: 1.3x the rate of 4-row tiles on a Zen 5-class EPYC; Q8_0 unchanged).
const WIDE_TILE_R: usize = 8;
/// Activation rows swept over each group of weight rows: with `k` up to a few thousand,
/// their blocks stay in L2.
const X_CHUNK: usize = 64;

/// A `[rows, cols]` weight matrix in a GGML block format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K, Q5_K, Q6_K), held as quants, f16 scales and offsets, in groups of [`GROUP`] rows
/// (the last padded with zero blocks).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    /// For each group and block, its rows' quant bytes as vectors of [`VEC_BYTES`] (4 for
    /// the 4-6-bit formats, whose bytes hold low nibbles, 8 for Q8_0), vector `j` holding
    /// bytes `4j..4j + 4` of row 0, then of row 1, and so on. Unpacking a 4-bit vector's low
    /// nibbles gives elements `4j..4j + 4` of every row, its high nibbles elements
    /// `16 + 4j..`: each 32-bit lane one row, ready for a broadcast activation quad.
    qs: Vec<u8>,
    /// Block scales, `[group][block][GROUP]`.
    d: Vec<f16>,
    /// Q4_1's block offsets (empty for the other formats), laid out as `d`. K-quants: `d`
    /// and `mins` hold each super-block's `d` and `dmin`, `[group][super-block][GROUP]`.
    mins: Vec<f16>,
    /// K-quants: per group and block of 32, [`SUB_BYTES`] bytes: the 6-bit scales of its
    /// rows, then their 6-bit minima (Q4_K, Q5_K), or the i8 scales of the block's
    /// first 16 values, then of its last 16 (Q6_K).
    sub: Vec<u8>,
    /// The bits above each quant's low nibble, per group and block, as [`hbits_bytes`]
    /// describes (Q5_0, Q5_1, Q5_K, Q6_K; empty otherwise).
    hbits: Vec<u8>,
}

/// K-quant sub-block scale bytes per group and block.
const SUB_BYTES: usize = 2 * GROUP;

/// Bytes of high bits per group and block: none for 4-bit formats; for 5-bit ones, one
/// plane of [`VEC_BYTES`], whose byte `t` holds in bit `n` the fifth bit of byte `t` of
/// nibble vector `n` (vectors 0-3 the low nibbles of the block's four quant vectors, 4-7
/// their high nibbles); for Q6_K, two such planes, plane `h`'s byte `t` holding in bits
/// `2p..2p + 2` the top two bits of byte `t` of nibble vector `4h + p`.
fn hbits_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => VEC_BYTES,
        GgmlType::Q6_K => 2 * VEC_BYTES,
        _ => 0,
    }
}

/// Sources larger than this are consumed in runs of rows this large, each freed once read.
const RELEASE_CHUNK: usize = 16 << 20;

/// Blocks of 32 per K-quant super-block.
const KSUB: usize = QK_K / QK;

/// Rows of weights interleaved per group: one activation block meets `GROUP` weight rows
/// in one 512-bit register, each lane accumulating its own row; 256-bit kernels take a
/// group as two halves of [`LANES`] rows.
pub(crate) const GROUP: usize = 16;

/// Rows of a 256-bit tile: half a group.
pub(crate) const LANES: usize = GROUP / 2;

/// Bytes of one quant vector of a group: four bytes of each of its rows.
pub(crate) const VEC_BYTES: usize = 4 * GROUP;

/// Why a [`QuantMatrix`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantMatrixError {
    #[error("no quantised matrix product for {0} weights (supported: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)")]
    Unsupported(GgmlType),
    #[error("{ty}: rows of {cols} values are not a whole number of {block}-value blocks", block = .ty.block_size())]
    PartialRow { ty: GgmlType, cols: usize },
    #[error("{ty}: {bytes} bytes, but {rows} × {cols} needs {expected}")]
    Size {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: usize,
        expected: usize,
    },
}

impl QuantMatrix {
    /// A matrix from its GGML blocks (`data`, row-major, as a GGUF file stores them).
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self, QuantMatrixError> {
        Self::consuming(ty, rows, cols, data, RELEASE_CHUNK)
    }

    /// [`Self::new`], a source above `release_chunk` bytes consumed and freed in runs of
    /// that many.
    fn consuming(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        release_chunk: usize,
    ) -> Result<Self, QuantMatrixError> {
        if !qdot::has_dot(ty) {
            return Err(QuantMatrixError::Unsupported(ty));
        }
        let row_bytes = ty
            .row_bytes(cols)
            .ok_or(QuantMatrixError::PartialRow { ty, cols })?;
        let expected = row_bytes * rows;
        if data.len() != expected {
            return Err(QuantMatrixError::Size {
                ty,
                rows,
                cols,
                bytes: data.len(),
                expected,
            });
        }
        let nb = cols / QK;
        let kq = kquants::is_kquant(ty);
        let padded = rows.next_multiple_of(GROUP);
        let scales = padded * if kq { nb / KSUB } else { nb };
        let quants = padded * nb * quant_bytes(ty);
        let has_mins = matches!(
            ty,
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K
        );
        let group_blocks = padded / GROUP * nb;
        let mut m = QuantMatrix {
            ty,
            rows,
            cols,
            nb,
            qs: vec![0; quants],
            d: vec![f16::ZERO; scales],
            mins: vec![f16::ZERO; if has_mins { scales } else { 0 }],
            sub: vec![0; if kq { group_blocks * SUB_BYTES } else { 0 }],
            hbits: vec![0; group_blocks * hbits_bytes(ty)],
        };
        // Filled from the last rows back, the source's tail freed as it goes (with glibc a
        // large block shrinks in place): a large matrix, such as a 262k-token vocabulary's
        // embeddings, is then never held twice in full. (The new layout's pages, zeroed by
        // the system, become resident only as they are written.)
        let mut data = data;
        let chunk_rows = if data.len() > release_chunk {
            (release_chunk / row_bytes.max(1)).max(1)
        } else {
            rows.max(1)
        };
        let mut end = rows;
        while end > 0 {
            let start = end.saturating_sub(chunk_rows);
            let chunk = &data[start * row_bytes..end * row_bytes];
            if kq {
                m.fill_k(chunk, start);
            } else {
                m.fill(chunk, start);
            }
            if chunk_rows < rows {
                data.truncate(start * row_bytes);
                data.shrink_to_fit();
            }
            end = start;
        }
        Ok(m)
    }

    /// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: each block's scale (and offset) and quants into their
    /// places.
    fn fill(&mut self, data: &[u8], first_row: usize) {
        let (ty, nb) = (self.ty, self.nb.max(1));
        for (blk, b) in data.chunks_exact(ty.type_size()).enumerate() {
            let (r, bi) = (first_row + blk / nb, blk % nb);
            let at = self.scale_index(r, bi);
            self.d[at] = f16::from_le_bytes([b[0], b[1]]);
            if let Some(m) = self.mins.get_mut(at) {
                *m = f16::from_le_bytes([b[2], b[3]]);
            }
            if ty == GgmlType::Q8_0 {
                for (j, quad) in b[2..].chunks_exact(4).enumerate() {
                    let q0 = self.group_quad(r, bi, j);
                    self.qs[q0..q0 + 4].copy_from_slice(quad);
                }
            } else {
                self.put_quants(r, bi, &block_quants(ty, b));
            }
        }
    }

    /// 4-6-bit formats: the unsigned quants of block `b` of row `r`, low nibbles into `qs`
    /// and the bits above them into `hbits`.
    fn put_quants(&mut self, r: usize, b: usize, q: &[u8]) {
        for j in 0..4 {
            let q0 = self.group_quad(r, b, j);
            for e in 0..4 {
                let i = 4 * j + e;
                self.qs[q0 + e] = (q[i] & 0x0F) | ((q[i + QK / 2] & 0x0F) << 4);
            }
        }
        let (gb, row) = ((r / GROUP) * self.nb + b, r % GROUP);
        let hb = hbits_bytes(self.ty);
        let h = &mut self.hbits[gb * hb..(gb + 1) * hb];
        for (i, &v) in q.iter().enumerate() {
            let (n, byte) = nibble_slot(i, row);
            match self.ty {
                GgmlType::Q6_K => h[(n / 4) * VEC_BYTES + byte] |= ((v >> 4) & 3) << (2 * (n % 4)),
                _ if hb > 0 => h[byte] |= ((v >> 4) & 1) << n,
                _ => {}
            }
        }
    }

    /// K-quants: each super-block's `d` and `dmin`, then each block of 32 as a 4-bit block
    /// of the groups layout (low nibbles), its sub-block scales in `sub` and its high bits
    /// in `hbits`.
    fn fill_k(&mut self, data: &[u8], first_row: usize) {
        let nsb = (self.nb / KSUB).max(1);
        for (blk, b) in data.chunks_exact(self.ty.type_size()).enumerate() {
            let (r, sb) = (first_row + blk / nsb, blk % nsb);
            let k = kquants::decode(self.ty, b);
            let at = self.super_index(r, sb);
            self.d[at] = k.d;
            if let Some(m) = self.mins.get_mut(at) {
                *m = k.dmin;
            }
            for t in 0..KSUB {
                self.put_k_block(r, sb * KSUB + t, &k, t);
            }
        }
    }

    /// Stores sub-block `t` (values `32t..32t + 32`) of `k` as block `b` of row `r`.
    fn put_k_block(&mut self, r: usize, b: usize, k: &KBlock, t: usize) {
        self.put_quants(r, b, &k.q[t * QK..(t + 1) * QK]);
        let (gb, row) = ((r / GROUP) * self.nb + b, r % GROUP);
        let sub = &mut self.sub[gb * SUB_BYTES..(gb + 1) * SUB_BYTES];
        (sub[row], sub[GROUP + row]) = if self.ty == GgmlType::Q6_K {
            (k.sc[2 * t], k.sc[2 * t + 1])
        } else {
            (k.sc[t], k.m[t])
        };
    }

    /// K-quants: index in `d` and `mins` of super-block `sb` of row `r`.
    fn super_index(&self, r: usize, sb: usize) -> usize {
        ((r / GROUP) * (self.nb / KSUB) + sb) * GROUP + r % GROUP
    }

    /// The `N` quant bytes of block `b` of row `r`: for the 4-6-bit formats the 16
    /// low-nibble bytes, in the file's order for Q4_0/Q4_1 (byte `i` holds values `i` and
    /// `i + 16`); for Q8_0 the 32 quants.
    fn quant_bytes_of<const N: usize>(&self, r: usize, b: usize) -> [u8; N] {
        let mut q = [0; N];
        for (j, quad) in q.chunks_exact_mut(4).enumerate() {
            let q0 = self.group_quad(r, b, j);
            quad.copy_from_slice(&self.qs[q0..q0 + 4]);
        }
        q
    }

    /// The 32 quants of block `b` of row `r`: unsigned, or Q8_0's i8 bytes.
    fn quants(&self, r: usize, b: usize) -> [u8; QK] {
        if self.ty == GgmlType::Q8_0 {
            return self.quant_bytes_of::<QK>(r, b);
        }
        let nib = self.quant_bytes_of::<{ QK / 2 }>(r, b);
        let (gb, row) = ((r / GROUP) * self.nb + b, r % GROUP);
        let hb = hbits_bytes(self.ty);
        let h = &self.hbits[gb * hb..(gb + 1) * hb];
        std::array::from_fn(|i| {
            let low = if i < QK / 2 {
                nib[i] & 0x0F
            } else {
                nib[i - QK / 2] >> 4
            };
            let (n, byte) = nibble_slot(i, row);
            let high = match self.ty {
                GgmlType::Q6_K => (h[(n / 4) * VEC_BYTES + byte] >> (2 * (n % 4))) & 3,
                _ if hb > 0 => (h[byte] >> n) & 1,
                _ => 0,
            };
            low | (high << 4)
        })
    }

    /// K-quants: block `b` of row `r` as its two sub-block scale bytes (see `sub`) and its
    /// 32 unsigned quants.
    fn k_block(&self, r: usize, b: usize) -> (u8, u8, [u8; QK]) {
        let (gb, row) = ((r / GROUP) * self.nb + b, r % GROUP);
        let sub = &self.sub[gb * SUB_BYTES..(gb + 1) * SUB_BYTES];
        (sub[row], sub[GROUP + row], self.quants(r, b))
    }

    /// K-quants: super-block `sb` of row `r` as [`KBlock`].
    fn kblock(&self, r: usize, sb: usize) -> KBlock {
        let at = self.super_index(r, sb);
        let mut k = KBlock {
            d: self.d[at],
            dmin: self.mins.get(at).copied().unwrap_or(f16::ZERO),
            ..KBlock::default()
        };
        for t in 0..KSUB {
            let (s0, s1, q) = self.k_block(r, sb * KSUB + t);
            k.q[t * QK..(t + 1) * QK].copy_from_slice(&q);
            if self.ty == GgmlType::Q6_K {
                (k.sc[2 * t], k.sc[2 * t + 1]) = (s0, s1);
            } else {
                (k.sc[t], k.m[t]) = (s0, s1);
            }
        }
        k
    }

    /// Index in `d` and `mins` of block `b` of row `r` (not a K-quant).
    fn scale_index(&self, r: usize, b: usize) -> usize {
        ((r / GROUP) * self.nb + b) * GROUP + r % GROUP
    }

    /// Offset in `qs` of quant bytes `4j..4j + 4` of block `b` of row `r`.
    fn group_quad(&self, r: usize, b: usize, j: usize) -> usize {
        let vectors = self.quant_bytes() / 4;
        (((r / GROUP) * self.nb + b) * vectors + j) * VEC_BYTES + (r % GROUP) * 4
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held, which is what one pass over the matrix reads.
    pub fn nbytes(&self) -> usize {
        self.qs.len() + 2 * (self.d.len() + self.mins.len()) + self.sub.len() + self.hbits.len()
    }

    fn quant_bytes(&self) -> usize {
        quant_bytes(self.ty)
    }

    /// Block `b` of row `r` (not a K-quant): `(d, m, quants)`, with `m` Q4_1's or Q5_1's
    /// offset (0 otherwise) and `quants` as [`Self::quants`].
    fn block(&self, r: usize, b: usize) -> (f32, f32, [u8; QK]) {
        let at = self.scale_index(r, b);
        let m = self.mins.get(at).map_or(0.0, |m| m.to_f32());
        (self.d[at].to_f32(), m, self.quants(r, b))
    }

    /// Row `r` as GGML blocks, as the file stored it.
    pub fn row_blocks(&self, r: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.nb * self.ty.type_size());
        if kquants::is_kquant(self.ty) {
            for sb in 0..self.nb / KSUB {
                kquants::encode(self.ty, &self.kblock(r, sb), &mut out);
            }
            return out;
        }
        for b in 0..self.nb {
            let at = self.scale_index(r, b);
            out.extend_from_slice(&self.d[at].to_le_bytes());
            if let Some(m) = self.mins.get(at) {
                out.extend_from_slice(&m.to_le_bytes());
            }
            let q = self.block(r, b).2;
            if self.ty == GgmlType::Q8_0 {
                out.extend_from_slice(&q);
                continue;
            }
            if matches!(self.ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                let qh = (0..QK).fold(0u32, |h, i| h | (((q[i] >> 4) & 1) as u32) << i);
                out.extend_from_slice(&qh.to_le_bytes());
            }
            out.extend((0..QK / 2).map(|i| (q[i] & 0x0F) | ((q[i + QK / 2] & 0x0F) << 4)));
        }
        out
    }

    /// Dequantises row `r` into `out` (`cols` long) with ggml's arithmetic.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        if kquants::is_kquant(self.ty) {
            for (sb, y) in out.chunks_exact_mut(QK_K).enumerate() {
                let k = self.kblock(r, sb);
                for (i, y) in y.iter_mut().enumerate() {
                    *y = k.value(self.ty, i);
                }
            }
            return;
        }
        for (b, y) in out.chunks_exact_mut(QK).enumerate() {
            let (d, m, q) = self.block(r, b);
            for (y, &q) in y.iter_mut().zip(&q) {
                *y = match self.ty {
                    GgmlType::Q4_0 => (q as i32 - 8) as f32 * d,
                    GgmlType::Q5_0 => (q as i32 - 16) as f32 * d,
                    GgmlType::Q4_1 | GgmlType::Q5_1 => q as f32 * d + m,
                    _ => q as i8 as f32 * d,
                };
            }
        }
    }
}

/// Where value `i` (0..32) of a block of row `r % GROUP == row` sits in the groups layout:
/// its nibble vector (0-3 low nibbles of the four quant vectors, 4-7 their high nibbles)
/// and its byte in that vector.
fn nibble_slot(i: usize, row: usize) -> (usize, usize) {
    let k = i % (QK / 2);
    ((i / (QK / 2)) * 4 + k / 4, row * 4 + k % 4)
}

/// The 32 unsigned quants of a Q4_0, Q4_1, Q5_0 or Q5_1 block as the file stores it: 16
/// bytes of nibbles at its end (byte `i` holding values `i` and `i + 16`), and for the 5-bit
/// formats the fifth bits of values 0..32 as a little-endian u32 just before them.
fn block_quants(ty: GgmlType, b: &[u8]) -> [u8; QK] {
    let n = b.len();
    let qs = &b[n - QK / 2..];
    let qh = if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
        u32::from_le_bytes(b[n - QK / 2 - 4..n - QK / 2].try_into().expect("4 bytes"))
    } else {
        0
    };
    std::array::from_fn(|i| {
        let low = if i < QK / 2 {
            qs[i] & 0x0F
        } else {
            qs[i - QK / 2] >> 4
        };
        low | ((((qh >> i) & 1) as u8) << 4)
    })
}

/// Quant bytes per block of a format with a dot product here.
fn quant_bytes(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 {
        QK
    } else {
        QK / 2
    }
}

thread_local! {
    /// The quantised rows of `x`, kept between calls so that decoding does not allocate.
    static XQ: RefCell<Q8Rows> = RefCell::new(Q8Rows::default());
}

/// `out[m, rows] = x[m, cols] · Wᵀ`, threaded over the weight rows.
pub fn matmul_quant(x: &[f32], w: &QuantMatrix, out: &mut [f32], m: usize) {
    check_shapes(x, w, out, m);
    if m == 0 || w.rows == 0 {
        return;
    }
    // Taken out rather than borrowed: while this thread waits for the parallel loop below,
    // rayon may run another product on it (another engine's forward pass), which then
    // finds an empty buffer instead of a borrowed one.
    let mut xq = XQ.take();
    let kernel = QKernel::best();
    xq.quantize(x, m, w.nb);
    let rows = rows_per_task(m, w.cols, w.rows, rayon::current_num_threads());
    let ptr = SendPtr(out.as_mut_ptr());
    if rows >= w.rows {
        dot_rows(&xq, w, ptr, m, 0, w.rows, kernel);
    } else {
        let xq = &xq;
        (0..w.rows.div_ceil(rows)).into_par_iter().for_each(|t| {
            let j0 = t * rows;
            dot_rows(xq, w, ptr, m, j0, rows.min(w.rows - j0), kernel);
        });
    }
    XQ.set(xq);
}

fn check_shapes(x: &[f32], w: &QuantMatrix, out: &[f32], m: usize) {
    assert_eq!(
        x.len(),
        m * w.cols,
        "matmul_quant: x must be [m={m}, k={}]",
        w.cols
    );
    assert_eq!(
        out.len(),
        m * w.rows,
        "matmul_quant: out must be [m={m}, n={}]",
        w.rows
    );
}

/// Whether the AVX2 kernels may run (`isa()` honours `MINIVLLM_ISA`; its AVX2 includes the
/// F16C that converts the scales).
fn use_avx2() -> bool {
    crate::cpu::isa() >= crate::cpu::Isa::Avx2
}

/// A pointer to `out` that parallel tasks write disjoint columns of.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: tasks write disjoint elements, as argued at each use.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    // A method, not field access, so that closures capture the whole Send wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Output columns `j0..j0 + nj` of every row: `out[i, j] = w[j] · x[i]`. Writes only those
/// elements of `out` (`m × w.rows`).
fn dot_rows(
    xq: &Q8Rows,
    w: &QuantMatrix,
    out: SendPtr,
    m: usize,
    j0: usize,
    nj: usize,
    kernel: QKernel,
) {
    let n = w.rows;
    let store = |i: usize, j: usize, v: f32| {
        debug_assert!(i < m && j < n);
        // SAFETY: `out` holds m × n floats (checked by `matmul_quant`), i < m, j < n, and
        // column j belongs to this task alone.
        unsafe { *out.get().add(i * n + j) = v };
    };
    if kernel == QKernel::Portable {
        return dot_rows_portable(xq, w, store, m, j0, nj);
    }
    #[cfg(target_arch = "x86_64")]
    let store_run = |i: usize, j: usize, v: &[f32]| {
        assert!(i < m && j + v.len() <= n);
        // SAFETY: `out` holds m × n floats (checked by `matmul_quant`), i < m, j + len <= n
        // (asserted), and these columns belong to this task alone.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out.get().add(i * n + j), v.len()) };
    };
    #[cfg(target_arch = "x86_64")]
    dot_groups(xq, w, store_run, m, j0, nj, kernel);
}

/// [`dot_rows`] on x86 (`j0` a multiple of [`GROUP`]): whole groups with AVX512-VNNI, half
/// groups with the 256-bit kernels.
#[cfg(target_arch = "x86_64")]
fn dot_groups(
    xq: &Q8Rows,
    w: &QuantMatrix,
    store_run: impl Fn(usize, usize, &[f32]),
    m: usize,
    j0: usize,
    nj: usize,
    kernel: QKernel,
) {
    debug_assert!(j0.is_multiple_of(GROUP));
    let wide = kernel == QKernel::Avx512Vnni;
    let (unit, tile_r) = if wide {
        (GROUP, WIDE_TILE_R)
    } else {
        (LANES, TILE_R)
    };
    // A tile's row of results, less the padding rows past the task's last column.
    let put = |i: usize, j: usize, v: &[f32]| store_run(i, j, &v[..v.len().min(j0 + nj - j)]);
    for i0 in (0..m).step_by(X_CHUNK) {
        let i1 = (i0 + X_CHUNK).min(m);
        for u in j0 / unit..(j0 + nj).div_ceil(unit) {
            for i in (i0..i1).step_by(tile_r) {
                // Both tiles' contracts: `kernel` is available (`QKernel::best` or a caller
                // that checked); group (or half group) u exists, rows being padded to whole
                // groups, and so do activation rows i..i + R <= m, with w.nb blocks each.
                macro_rules! wide {
                    ($r:literal) => {{
                        // SAFETY: as said above the macros.
                        let v = unsafe { avx512::tile_group::<$r>(w, u, xq, i) };
                        put_tile(&v, i, u * GROUP, &put);
                    }};
                }
                macro_rules! narrow {
                    ($r:literal) => {{
                        // SAFETY: as said above the macros.
                        let v = unsafe { x86::tile_group::<$r>(kernel, w, u, xq, i) };
                        put_tile(&v, i, u * LANES, &put);
                    }};
                }
                match (wide, tile_r.min(i1 - i)) {
                    (true, 8) => wide!(8),
                    (true, 7) => wide!(7),
                    (true, 6) => wide!(6),
                    (true, 5) => wide!(5),
                    (true, 4) => wide!(4),
                    (true, 3) => wide!(3),
                    (true, 2) => wide!(2),
                    (true, _) => wide!(1),
                    (false, 4) => narrow!(4),
                    (false, 3) => narrow!(3),
                    (false, 2) => narrow!(2),
                    (false, _) => narrow!(1),
                }
            }
        }
    }
}

/// Stores a tile's results: row `r` of `v` from row `i + r`, column `j` on.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn put_tile<const N: usize>(
    v: &[[f32; N]],
    i: usize,
    j: usize,
    put: impl Fn(usize, usize, &[f32]),
) {
    for (r, lanes) in v.iter().enumerate() {
        put(i + r, j, lanes);
    }
}

/// One weight row unpacked for the portable kernel: per block of 32, its quants (unsigned,
/// or Q8_0's i8 bytes), the scales of its two halves of 16 (equal but for Q6_K), and the
/// factor of the activations' block sum that applies the format's offset.
#[derive(Default)]
struct PortableRow {
    q: Vec<[u8; QK]>,
    scales: Vec<[f32; 2]>,
    offset: Vec<f32>,
}

impl PortableRow {
    /// Unpacks row `j` of `w`, reusing the buffers.
    fn unpack(&mut self, w: &QuantMatrix, j: usize) {
        self.q.clear();
        self.scales.clear();
        self.offset.clear();
        for b in 0..w.nb {
            if kquants::is_kquant(w.ty) {
                let at = w.super_index(j, b / KSUB);
                let d = w.d[at].to_f32();
                let (s0, s1, q) = w.k_block(j, b);
                self.q.push(q);
                if w.ty == GgmlType::Q6_K {
                    self.scales.push([d * s0 as i8 as f32, d * s1 as i8 as f32]);
                    self.offset.push(0.0);
                } else {
                    self.scales.push([d * s0 as f32; 2]);
                    self.offset.push(-(w.mins[at].to_f32() * s1 as f32));
                }
                continue;
            }
            let (d, m, q) = w.block(j, b);
            self.q.push(q);
            self.scales.push([d; 2]);
            self.offset.push(match w.ty {
                GgmlType::Q4_0 => -8.0 * d,
                GgmlType::Q5_0 => -16.0 * d,
                GgmlType::Q4_1 | GgmlType::Q5_1 => m,
                _ => 0.0,
            });
        }
    }

    /// `w[j] · x[i]` for the row unpacked from `w`, in the AVX2 kernels' arithmetic per
    /// block (its rounding differs from theirs, which sum in vector lanes). Q6_K's `-32` is
    /// taken off each half's integer sum through the activations' half sums.
    fn dot(&self, w: &QuantMatrix, x: &Q8Rows, i: usize) -> f32 {
        let nb = w.nb;
        let signed = w.ty == GgmlType::Q8_0;
        let (mut sum, mut offs) = (0.0f32, 0.0f32);
        for b in 0..nb {
            let y = &x.qs[(i * nb + b) * QK..(i * nb + b + 1) * QK];
            let q = &self.q[b];
            let at = i * nb + b;
            let isum = |r: std::ops::Range<usize>| -> i32 {
                r.map(|t| if signed { q[t] as i8 as i32 } else { q[t] as i32 } * y[t] as i32)
                    .sum()
            };
            let [dlo, dhi] = self.scales[b];
            if w.ty == GgmlType::Q6_K {
                let [ylo, yhi] = x.halves[at];
                sum += (isum(0..QK / 2) - 32 * ylo) as f32 * (dlo * x.d[at]);
                sum += (isum(QK / 2..QK) - 32 * yhi) as f32 * (dhi * x.d[at]);
            } else {
                sum += isum(0..QK) as f32 * (dlo * x.d[at]);
                offs += self.offset[b] * x.s[at];
            }
        }
        sum + offs
    }
}

thread_local! {
    /// The portable kernel's unpacked weight row, kept between calls.
    static PORTABLE_ROW: std::cell::Cell<PortableRow> = std::cell::Cell::new(PortableRow::default());
}

/// The portable path of [`dot_rows`]: each weight row unpacked once, then dotted with every
/// activation row.
fn dot_rows_portable(
    xq: &Q8Rows,
    w: &QuantMatrix,
    store: impl Fn(usize, usize, f32),
    m: usize,
    j0: usize,
    nj: usize,
) {
    let mut row = PORTABLE_ROW.take();
    for j in j0..j0 + nj {
        row.unpack(w, j);
        for i in 0..m {
            store(i, j, row.dot(w, xq, i));
        }
    }
    PORTABLE_ROW.set(row);
}

/// Single-threaded reference for [`matmul_quant`]: ggml's block formulas, scalar, on the
/// blocks as the file stores them.
pub fn matmul_quant_scalar(x: &[f32], w: &QuantMatrix, out: &mut [f32], m: usize) {
    check_shapes(x, w, out, m);
    let mut xq = vec![BlockQ8::default(); w.nb];
    let rows: Vec<Vec<u8>> = (0..w.rows).map(|r| w.row_blocks(r)).collect();
    for (xr, orow) in x
        .chunks_exact(w.cols.max(1))
        .zip(out.chunks_exact_mut(w.rows.max(1)))
    {
        qdot::quantize_row_q8(xr, &mut xq);
        for (o, wr) in orow.iter_mut().zip(&rows) {
            *o = qdot::vec_dot_scalar(w.ty, wr, &xq);
        }
    }
}

#[cfg(test)]
mod tests;
