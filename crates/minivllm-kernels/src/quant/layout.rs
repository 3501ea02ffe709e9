//! The weights' layout for the quantised kernels: a GGML matrix split at load into quants,
//! scales and offsets, rows interleaved in groups.
//!
//! Every format is interleaved in groups of sixteen rows (after the row-interleaved `_R8`
//! layouts of ik_llama.cpp and llama.cpp's CPU repack): each 32-bit lane of a register
//! holds four quants of its own row, so one broadcast activation quad meets sixteen rows at
//! once in a 512-bit register (eight, taking half a group, in a 256-bit one), the block's
//! integer sums come out one row per lane with no horizontal sums, and the rows' scales
//! convert and multiply as one vector. Each group is one sequential stream of memory, which
//! is what decoding, bound by reading it, wants. (Q8_0 walked rows four at a time until the
//! fifth pass: 20 % slower per byte in decode, with a horizontal sum per output. Groups were
//! eight rows until the 512-bit kernels came: their registers take the two halves from one
//! 64-byte load.) The bytes are those of the file, rearranged: [`QuantMatrix::row_blocks`]
//! gives them back.

use half::f16;

use super::dequant::{e8m0_to_f32_half, KVALUES_MXFP4};
use super::formats::{GgmlType, QK, QK_K};
use super::kquants::{self, KBlock};
use super::reference;

/// A `[rows, cols]` weight matrix in a GGML block format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
/// Q4_K, Q5_K, Q6_K), held as quants, f16 scales and offsets, in groups of [`GROUP`] rows
/// (the last padded with zero blocks).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    pub(super) ty: GgmlType,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Blocks per row.
    pub(super) nb: usize,
    /// For each group and block, its rows' quant bytes as vectors of [`VEC_BYTES`] (4 for
    /// the 4-6-bit formats, whose bytes hold low nibbles, 8 for Q8_0), vector `j` holding
    /// bytes `4j..4j + 4` of row 0, then of row 1, and so on. Unpacking a 4-bit vector's low
    /// nibbles gives elements `4j..4j + 4` of every row, its high nibbles elements
    /// `16 + 4j..`: each 32-bit lane one row, ready for a broadcast activation quad.
    pub(super) qs: Vec<u8>,
    /// Block scales, `[group][block][GROUP]`.
    pub(super) d: Vec<f16>,
    /// Q4_1's block offsets (empty for the other formats), laid out as `d`. K-quants: `d`
    /// and `mins` hold each super-block's `d` and `dmin`, `[group][super-block][GROUP]`.
    pub(super) mins: Vec<f16>,
    /// K-quants: per group and block of 32, [`sub_bytes`] bytes. Q6_K: the i8 scales of
    /// the block's first 16 values, then of its last 16. Q4_K and Q5_K: one byte per row,
    /// its 6-bit scale with the low two bits of its 6-bit minimum above; the minimum's top
    /// four bits are in `mins_hi`. (Twelve bytes per row and super-block, as in the file:
    /// a byte each for the scale and the minimum was 2.8 % more than a Q4_K file holds,
    /// 0.33 GB of a 30B-A3B model.)
    pub(super) sub: Vec<u8>,
    /// Q4_K and Q5_K: per group and super-block, [`VEC_BYTES`] bytes, one little-endian
    /// u32 per row whose nibble `t` holds the top four bits of block `t`'s minimum; a
    /// register of them shifts four bits on per block. Empty for other formats.
    pub(super) mins_hi: Vec<u8>,
    /// The bits above each quant's low nibble, per group and block, as [`hbits_bytes`]
    /// describes (Q5_0, Q5_1, Q5_K, Q6_K; empty otherwise).
    pub(super) hbits: Vec<u8>,
    /// Q6_K: per group and super-block, each row's `128 Σ_h sc_h Σ_(i in h) (q_i - 32)`
    /// (`h` its halves of 16, `sc_h` their scales), laid out as `d`: a term of the weights
    /// alone, which the 512-bit tile for unsigned activations (`a + 128` against `q - 32`)
    /// takes off each super-block's sum. 1.9 % of a Q6_K matrix; empty for other formats.
    pub(super) q6_offsets: Vec<i32>,
    /// K-quants: the products quantise their activations with one scale per block of 32,
    /// as for every other format, instead of one per super-block
    /// ([`super::activations::shared_blocks`]). Set by [`Self::keep_block_activation_scales`]
    /// for matrices whose inputs carry large outliers.
    pub(super) block_activations: bool,
}

/// K-quant sub-block scale bytes per group and block (see [`QuantMatrix::sub`]).
pub(super) fn sub_bytes(ty: GgmlType) -> usize {
    if ty == GgmlType::Q6_K {
        2 * GROUP
    } else {
        GROUP
    }
}

/// Bytes of high bits per group and block: none for 4-bit formats; for 5-bit ones, one
/// plane of [`VEC_BYTES`], whose byte `t` holds in bit `n` the fifth bit of byte `t` of
/// nibble vector `n` (vectors 0-3 the low nibbles of the block's four quant vectors, 4-7
/// their high nibbles); for Q6_K, two such planes, plane `h`'s byte `t` holding in bits
/// `2p..2p + 2` the top two bits of byte `t` of nibble vector `4h + p`.
pub(super) fn hbits_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => VEC_BYTES,
        GgmlType::Q6_K => 2 * VEC_BYTES,
        _ => 0,
    }
}

/// Sources larger than this are consumed in runs of rows this large, each freed once read.
const RELEASE_CHUNK: usize = 16 << 20;

/// Blocks of 32 per K-quant super-block.
pub(super) const KSUB: usize = QK_K / QK;

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
    #[error("no quantised matrix product for {0} weights (supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4)")]
    Unsupported(GgmlType),
    /// An MXFP4 block's scale outside what the kernels hold exactly (an f16: 2^-24 to
    /// 2^15); such a matrix computes in floats instead.
    #[error("MXFP4: row {row} has a block scale of 2^{exponent}, beyond the f16 the kernels keep scales in")]
    ScaleRange { row: usize, exponent: i32 },
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
    pub(super) fn consuming(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
        release_chunk: usize,
    ) -> Result<Self, QuantMatrixError> {
        if !reference::has_dot(ty) {
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
            sub: vec![0; if kq { group_blocks * sub_bytes(ty) } else { 0 }],
            mins_hi: vec![
                0;
                if kq && has_mins {
                    scales / GROUP * VEC_BYTES
                } else {
                    0
                }
            ],
            hbits: vec![0; group_blocks * hbits_bytes(ty)],
            q6_offsets: vec![0; if ty == GgmlType::Q6_K { scales } else { 0 }],
            block_activations: false,
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
                m.fill(chunk, start)?;
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
    fn fill(&mut self, data: &[u8], first_row: usize) -> Result<(), QuantMatrixError> {
        let (ty, nb) = (self.ty, self.nb.max(1));
        for (blk, b) in data.chunks_exact(ty.type_size()).enumerate() {
            let (r, bi) = (first_row + blk / nb, blk % nb);
            let at = self.scale_index(r, bi);
            if ty == GgmlType::MXFP4 {
                self.d[at] = mxfp4_scale(b).ok_or(QuantMatrixError::ScaleRange {
                    row: r,
                    exponent: i32::from(b[0]) - 128,
                })?;
                self.put_quants(r, bi, &block_quants(ty, b));
                continue;
            }
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
        Ok(())
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
            if let Some(o) = self.q6_offsets.get_mut(at) {
                *o = q6_offset(&k);
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
        let n = sub_bytes(self.ty);
        let sub = &mut self.sub[gb * n..(gb + 1) * n];
        if self.ty == GgmlType::Q6_K {
            (sub[row], sub[GROUP + row]) = (k.sc[2 * t], k.sc[2 * t + 1]);
            return;
        }
        let (sc, m) = (k.sc[t], k.m[t]);
        debug_assert!(sc < 64 && m < 64, "K-quant scales are 6-bit");
        sub[row] = sc | (m & 3) << 6;
        let at = self.mins_hi_byte(r, b);
        self.mins_hi[at] |= (m >> 2) << (4 * (t % 2));
    }

    /// Q4_K, Q5_K: the byte of `mins_hi` whose nibble `b % 2` holds block `b`'s of row `r`.
    fn mins_hi_byte(&self, r: usize, b: usize) -> usize {
        self.super_index(r, b / KSUB) * 4 + (b % KSUB) / 2
    }

    /// K-quants: index in `d` and `mins` of super-block `sb` of row `r`.
    pub(super) fn super_index(&self, r: usize, sb: usize) -> usize {
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
    pub(super) fn k_block(&self, r: usize, b: usize) -> (u8, u8, [u8; QK]) {
        let (gb, row) = ((r / GROUP) * self.nb + b, r % GROUP);
        let n = sub_bytes(self.ty);
        let sub = &self.sub[gb * n..(gb + 1) * n];
        if self.ty == GgmlType::Q6_K {
            return (sub[row], sub[GROUP + row], self.quants(r, b));
        }
        let high = (self.mins_hi[self.mins_hi_byte(r, b)] >> (4 * (b % 2))) & 0x0F;
        let (sc, m) = (sub[row] & 0x3F, (sub[row] >> 6) | high << 2);
        (sc, m, self.quants(r, b))
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

    /// Keeps a scale per block of 32 for the activations of this matrix's products (no
    /// change but for the K-quants, whose products otherwise share one per super-block of
    /// 256, as ggml's Q8_K). Meant for down projections: their inputs, the gated
    /// activations, carry the largest outliers, and one scale per 256 values left the rest
    /// of a super-block a few levels (SmolLM2 re-quantised to Q4_K_M, whose Q4_K tensors
    /// are its down projections, moved a nat from its float32 path). Costs these matrices'
    /// products about a sixth of their speed on AVX2.
    pub fn keep_block_activation_scales(&mut self) {
        self.block_activations = true;
        // Read only by the tile for shared activation scales.
        self.q6_offsets = Vec::new();
    }

    /// Whether [`Self::keep_block_activation_scales`] was called.
    pub fn keeps_block_activation_scales(&self) -> bool {
        self.block_activations
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

    /// Bytes one pass over the matrix reads: what a one-row product reads (Q6_K's
    /// [`Self::q6_offsets`], which only many-row products read, aside).
    pub fn nbytes(&self) -> usize {
        self.qs.len()
            + 2 * (self.d.len() + self.mins.len())
            + self.sub.len()
            + self.mins_hi.len()
            + self.hbits.len()
    }

    fn quant_bytes(&self) -> usize {
        quant_bytes(self.ty)
    }

    /// Block `b` of row `r` (not a K-quant): `(d, m, quants)`, with `m` Q4_1's or Q5_1's
    /// offset (0 otherwise) and `quants` as [`Self::quants`].
    pub(super) fn block(&self, r: usize, b: usize) -> (f32, f32, [u8; QK]) {
        let at = self.scale_index(r, b);
        let m = self.mins.get(at).map_or(0.0, |m| m.to_f32());
        (self.d[at].to_f32(), m, self.quants(r, b))
    }

    /// Row `r` as GGML blocks, as the file stored it (but for an all-zero MXFP4 block
    /// whose scale byte had no f16: the same values, with `e = 0`).
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
            if self.ty == GgmlType::MXFP4 {
                // The scale's exponent back as E8M0 (2^(e - 128)); a block of zeros held
                // its scale as 0 and gets e = 0.
                let d = self.d[at].to_f32();
                out.push(if d == 0.0 {
                    0
                } else {
                    ((d.to_bits() >> 23) + 1) as u8
                });
                let q = self.block(r, b).2;
                out.extend((0..QK / 2).map(|i| (q[i] & 0x0F) | ((q[i + QK / 2] & 0x0F) << 4)));
                continue;
            }
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
                    GgmlType::MXFP4 => f32::from(KVALUES_MXFP4[usize::from(q)]) * d,
                    _ => q as i8 as f32 * d,
                };
            }
        }
    }
}

/// Whether every block of these MXFP4 blocks has a scale [`QuantMatrix`] holds exactly
/// (else it refuses them with [`QuantMatrixError::ScaleRange`]).
pub fn mxfp4_scales_fit(blocks: &[u8]) -> bool {
    blocks
        .chunks_exact(GgmlType::MXFP4.type_size())
        .all(|b| mxfp4_scale(b).is_some())
}

/// An MXFP4 block's scale, ggml's E8M0 halved (2^(e - 128)), as an f16 when that is exact;
/// a block whose every value is zero needs none (0). `None`: the scale has no exact f16.
fn mxfp4_scale(b: &[u8]) -> Option<f16> {
    let d = e8m0_to_f32_half(b[0]);
    let h = f16::from_f32(d);
    if h.to_f32() == d {
        return Some(h);
    }
    let zero = |n: u8| KVALUES_MXFP4[usize::from(n)] == 0;
    b[1..]
        .iter()
        .all(|&q| zero(q & 0x0F) && zero(q >> 4))
        .then_some(f16::ZERO)
}

/// A Q6_K super-block's entry of [`QuantMatrix::q6_offsets`].
fn q6_offset(k: &KBlock) -> i32 {
    let halves = k.q.chunks_exact(QK_K / 16).zip(k.sc);
    128 * halves
        .map(|(q, sc)| i32::from(sc as i8) * q.iter().map(|&v| i32::from(v) - 32).sum::<i32>())
        .sum::<i32>()
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
