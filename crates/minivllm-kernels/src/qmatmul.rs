//! Linear layers over weights kept in their GGML block format.
//!
//! Every row of `x` is quantised once to 8-bit blocks of 32 (ggml's Q8_0/Q8_1) and every
//! output is an integer dot product of blocks, as llama.cpp computes ([`crate::qdot`] has
//! ggml's reference formulas). Decoding a few rows is bound by reading the weights, which
//! stay 4-8x smaller than f32; many rows (prefill) run the same products in tiles (4 activation
//! rows against a group of 8 weight rows, or `TILE_R × TILE_C` for Q8_0), so that weights and
//! activations are each unpacked once per tile.
//!
//! Weights are split at load into quants, scales and offsets; the bytes are those of the
//! file, rearranged. 4-bit formats (Q4_0, Q4_1) are interleaved in groups of eight rows
//! ([`Layout::Groups`], after the row-interleaved `_R8` layouts of ik_llama.cpp and
//! llama.cpp's CPU repack): each 32-bit lane of a register holds four quants of its own row,
//! so one broadcast activation quad meets eight rows at once, the block's integer sums come
//! out one row per lane with no horizontal sums, and eight rows' scales convert and multiply
//! as one vector. Q8_0 stays row by row, each row's scales padded to whole groups of
//! `SCALE_GROUP` blocks so that they too convert eight at a time.
//!
//! One path for every batch size is deliberate: each output is summed in an order that
//! depends only on its own row, so a sequence's logits are bit-for-bit the same whatever
//! else is batched with it. (An f32 path for large batches would be faster on AVX2, but it
//! would differ from this one by rounding, and 8-bit rounding of the next layer's inputs
//! amplifies such differences into different greedy tokens.)

use std::cell::RefCell;

use half::f16;
use rayon::prelude::*;

use crate::matmul::rows_per_task;
use crate::qdot::{self, BlockQ8, QK};
use crate::quant::GgmlType;

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Blocks whose scales are handled as one f32 vector.
const SCALE_GROUP: usize = 8;
/// Activation rows per tile.
const TILE_R: usize = 4;
/// Weight rows per tile.
const TILE_C: usize = 2;
/// Weight rows per tile when `x` has a single row (decoding one sequence): more rows in
/// flight, and registers to spare without the other activation rows.
const TILE_C_ONE_ROW: usize = 4;
/// Activation rows per tile of the groups layout (each against `GROUP` weight rows).
const GROUP_TILE_R: usize = 4;
/// Activation rows swept over each pair of weight rows: with `k` up to a few thousand,
/// their blocks stay in L2.
const X_CHUNK: usize = 64;

/// A `[rows, cols]` weight matrix in a GGML block format (Q4_0, Q4_1, Q8_0), held as
/// quants, f16 scales and (Q4_1) f16 offsets.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    ty: GgmlType,
    layout: Layout,
    rows: usize,
    cols: usize,
    /// Blocks per row.
    nb: usize,
    /// `nb` rounded up to `SCALE_GROUP`: the stride of `d` and `mins` in the rows layout.
    nbp: usize,
    /// Rows layout: each row's quants, `quant_bytes()` per block, blocks back to back.
    /// Groups layout: see [`Layout::Groups`].
    qs: Vec<u8>,
    /// Block scales: per row, zero past `nb` (rows layout), or `[group][block][GROUP]`.
    d: Vec<f16>,
    /// Q4_1's block offsets (empty for the other formats), laid out as `d`.
    mins: Vec<f16>,
}

/// Rows of 4-bit weights interleaved per group: one activation block meets `GROUP` weight
/// rows in one register, each lane accumulating its own row.
pub(crate) const GROUP: usize = 8;

/// How a [`QuantMatrix`] orders its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Row after row (Q8_0).
    Rows,
    /// 4-bit formats: rows in groups of [`GROUP`] (the last padded with zero blocks); for
    /// each group and block, the 16 quant bytes of its rows as 4 vectors of 32 bytes, vector
    /// `j` holding bytes `4j..4j + 4` of row 0, then of row 1, and so on. Unpacking a vector's
    /// low nibbles gives elements `4j..4j + 4` of every row, its high nibbles elements
    /// `16 + 4j..`: each 32-bit lane one row, ready for a broadcast activation quad.
    Groups,
}

/// Why a [`QuantMatrix`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantMatrixError {
    #[error("no quantised matrix product for {0} weights (supported: Q4_0, Q4_1, Q8_0)")]
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
        let nbp = nb.next_multiple_of(SCALE_GROUP);
        let layout = if ty == GgmlType::Q8_0 {
            Layout::Rows
        } else {
            Layout::Groups
        };
        let (scales, quants) = match layout {
            Layout::Rows => (rows * nbp, rows * nb * quant_bytes(ty)),
            Layout::Groups => {
                let padded = rows.next_multiple_of(GROUP) * nb;
                (padded, padded * quant_bytes(ty))
            }
        };
        let mut m = QuantMatrix {
            ty,
            layout,
            rows,
            cols,
            nb,
            nbp,
            qs: vec![0; quants],
            d: vec![f16::ZERO; scales],
            mins: vec![f16::ZERO; if ty == GgmlType::Q4_1 { scales } else { 0 }],
        };
        let header = ty.type_size() - quant_bytes(ty);
        for (blk, b) in data.chunks_exact(ty.type_size()).enumerate() {
            let (r, bi) = (blk / nb.max(1), blk % nb.max(1));
            let at = m.scale_index(r, bi);
            m.d[at] = f16::from_le_bytes([b[0], b[1]]);
            if ty == GgmlType::Q4_1 {
                m.mins[at] = f16::from_le_bytes([b[2], b[3]]);
            }
            let q = &b[header..];
            match layout {
                Layout::Rows => {
                    let q0 = (r * nb + bi) * q.len();
                    m.qs[q0..q0 + q.len()].copy_from_slice(q);
                }
                Layout::Groups => {
                    for (j, quad) in q.chunks_exact(4).enumerate() {
                        let q0 = m.group_quad(r, bi, j);
                        m.qs[q0..q0 + 4].copy_from_slice(quad);
                    }
                }
            }
        }
        Ok(m)
    }

    /// Index in `d` and `mins` of block `b` of row `r`.
    fn scale_index(&self, r: usize, b: usize) -> usize {
        match self.layout {
            Layout::Rows => r * self.nbp + b,
            Layout::Groups => ((r / GROUP) * self.nb + b) * GROUP + r % GROUP,
        }
    }

    /// Groups layout: offset in `qs` of quant bytes `4j..4j + 4` of block `b` of row `r`.
    fn group_quad(&self, r: usize, b: usize, j: usize) -> usize {
        (((r / GROUP) * self.nb + b) * 4 + j) * 4 * GROUP + (r % GROUP) * 4
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
        self.qs.len() + 2 * (self.d.len() + self.mins.len())
    }

    fn quant_bytes(&self) -> usize {
        quant_bytes(self.ty)
    }

    /// Block `b` of row `r`: `(d, m, quants)`, with `m` Q4_1's offset (0 otherwise) and the
    /// first `quant_bytes()` of `quants` the block's quants in the file's order.
    fn block(&self, r: usize, b: usize) -> (f32, f32, [u8; QK]) {
        let qb = self.quant_bytes();
        let at = self.scale_index(r, b);
        let m = self.mins.get(at).map_or(0.0, |m| m.to_f32());
        let mut q = [0; QK];
        match self.layout {
            Layout::Rows => {
                let q0 = (r * self.nb + b) * qb;
                q[..qb].copy_from_slice(&self.qs[q0..q0 + qb]);
            }
            Layout::Groups => {
                for (j, quad) in q[..qb].chunks_exact_mut(4).enumerate() {
                    let q0 = self.group_quad(r, b, j);
                    quad.copy_from_slice(&self.qs[q0..q0 + 4]);
                }
            }
        }
        (self.d[at].to_f32(), m, q)
    }

    /// Row `r` as GGML blocks, as the file stored it.
    pub fn row_blocks(&self, r: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.nb * self.ty.type_size());
        for b in 0..self.nb {
            let at = self.scale_index(r, b);
            out.extend_from_slice(&self.d[at].to_le_bytes());
            if let Some(m) = self.mins.get(at) {
                out.extend_from_slice(&m.to_le_bytes());
            }
            out.extend_from_slice(&self.block(r, b).2[..self.quant_bytes()]);
        }
        out
    }

    /// Dequantises row `r` into `out` (`cols` long) with ggml's arithmetic.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequantize_row: output length");
        for (b, y) in out.chunks_exact_mut(QK).enumerate() {
            let (d, m, q) = self.block(r, b);
            let q = &q[..self.quant_bytes()];
            match self.ty {
                GgmlType::Q4_0 => {
                    for (j, &q) in q.iter().enumerate() {
                        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                        y[j + QK / 2] = ((q >> 4) as i32 - 8) as f32 * d;
                    }
                }
                GgmlType::Q4_1 => {
                    for (j, &q) in q.iter().enumerate() {
                        y[j] = (q & 0x0F) as f32 * d + m;
                        y[j + QK / 2] = (q >> 4) as f32 * d + m;
                    }
                }
                _ => {
                    for (y, &q) in y.iter_mut().zip(q) {
                        *y = q as i8 as f32 * d;
                    }
                }
            }
        }
    }
}

/// Quant bytes per block of a format with a dot product here.
fn quant_bytes(ty: GgmlType) -> usize {
    if ty == GgmlType::Q8_0 {
        QK
    } else {
        QK / 2
    }
}

/// Activation rows quantised for the kernels: the layout of [`QuantMatrix`], with scales
/// `d` and block sums `s` (`d · Σ q`, see [`BlockQ8`]) as f32, padded with zeros.
#[derive(Default)]
struct Q8Rows {
    qs: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
}

impl Q8Rows {
    /// Quantises the `m` rows of `x` (`nb` blocks each), reusing the buffers; prefills
    /// split the rows over the pool (quantising 512 rows on one thread while the other
    /// waited was a quarter of a prefill's time).
    fn quantize(&mut self, x: &[f32], m: usize, nb: usize) {
        let nbp = nb.next_multiple_of(SCALE_GROUP);
        self.qs.resize(m * nb * QK, 0);
        self.d.clear();
        self.d.resize(m * nbp, 0.0);
        self.s.clear();
        self.s.resize(m * nbp, 0.0);
        if nb == 0 {
            return;
        }
        let avx2 = use_avx2();
        let rows = x
            .par_chunks_exact(nb * QK)
            .zip(self.qs.par_chunks_exact_mut(nb * QK))
            .zip(self.d.par_chunks_exact_mut(nbp))
            .zip(self.s.par_chunks_exact_mut(nbp));
        rows.with_min_len(QUANTIZE_ROWS_PER_TASK)
            .for_each(|(((x, qs), d), s)| quantize_row(x, qs, &mut d[..nb], &mut s[..nb], avx2));
    }
}

/// Activation rows quantised per parallel task: a few microseconds of work each.
const QUANTIZE_ROWS_PER_TASK: usize = 16;

/// One row of [`Q8Rows::quantize`]: `nb` blocks into `qs`, `d` and `s` (`nb` long).
fn quantize_row(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32], avx2: bool) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` came from `use_avx2()`; x holds nb blocks (chunked above).
        return unsafe { avx2::quantize_row(x, qs, d, s) };
    }
    let _ = avx2;
    for b in 0..d.len() {
        quantize_block_into(x, b, qs, d, s);
    }
}

/// Block `b` of an activation row by the scalar reference, stored into the row's `qs`, `d`
/// and `s`.
fn quantize_block_into(x: &[f32], b: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let q = qdot::quantize_block(&x[b * QK..(b + 1) * QK]);
    (d[b], s[b]) = (q.d, q.s);
    qs[b * QK..(b + 1) * QK].copy_from_slice(&q.qs);
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
    xq.quantize(x, m, w.nb);
    let rows = rows_per_task(m, w.cols, w.rows, rayon::current_num_threads());
    let avx2 = use_avx2();
    let ptr = SendPtr(out.as_mut_ptr());
    if rows >= w.rows {
        dot_rows(&xq, w, ptr, m, 0, w.rows, avx2);
    } else {
        let xq = &xq;
        (0..w.rows.div_ceil(rows)).into_par_iter().for_each(|t| {
            let j0 = t * rows;
            dot_rows(xq, w, ptr, m, j0, rows.min(w.rows - j0), avx2);
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
    avx2: bool,
) {
    let n = w.rows;
    let store = |i: usize, j: usize, v: f32| {
        debug_assert!(i < m && j < n);
        // SAFETY: `out` holds m × n floats (checked by `matmul_quant`), i < m, j < n, and
        // column j belongs to this task alone.
        unsafe { *out.get().add(i * n + j) = v };
    };
    if !avx2 {
        for j in j0..j0 + nj {
            for i in 0..m {
                store(i, j, dot_portable(w, j, xq, i));
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if w.layout == Layout::Groups {
        return dot_groups(xq, w, store, m, j0, nj);
    }
    #[cfg(target_arch = "x86_64")]
    for i0 in (0..m).step_by(X_CHUNK) {
        let i1 = (i0 + X_CHUNK).min(m);
        let tile_c = if i1 - i0 == 1 { TILE_C_ONE_ROW } else { TILE_C };
        for j in (j0..j0 + nj).step_by(tile_c) {
            let cols = tile_c.min(j0 + nj - j);
            for i in (i0..i1).step_by(TILE_R) {
                macro_rules! go {
                    ($r:literal, $c:literal) => {{
                        // SAFETY: `avx2` came from `use_avx2()`; weight rows j..j + $c <= n
                        // and activation rows i..i + $r <= m exist, with w.nb blocks each.
                        let v = unsafe { avx2::tile::<$r, $c>(w, j, xq, i) };
                        for (r, row) in v.iter().enumerate() {
                            for (c, &v) in row.iter().enumerate() {
                                store(i + r, j + c, v);
                            }
                        }
                    }};
                }
                match (TILE_R.min(i1 - i), cols) {
                    (1, 4) => go!(1, 4),
                    (1, 3) => go!(1, 3),
                    (4, 2) => go!(4, 2),
                    (3, 2) => go!(3, 2),
                    (2, 2) => go!(2, 2),
                    (1, 2) => go!(1, 2),
                    (4, _) => go!(4, 1),
                    (3, _) => go!(3, 1),
                    (2, _) => go!(2, 1),
                    _ => go!(1, 1),
                }
            }
        }
    }
}

/// [`dot_rows`] for the groups layout (`j0` a multiple of [`GROUP`]), on AVX2.
#[cfg(target_arch = "x86_64")]
fn dot_groups(
    xq: &Q8Rows,
    w: &QuantMatrix,
    store: impl Fn(usize, usize, f32),
    m: usize,
    j0: usize,
    nj: usize,
) {
    debug_assert!(j0.is_multiple_of(GROUP));
    for i0 in (0..m).step_by(X_CHUNK) {
        let i1 = (i0 + X_CHUNK).min(m);
        for g in j0 / GROUP..(j0 + nj).div_ceil(GROUP) {
            for i in (i0..i1).step_by(GROUP_TILE_R) {
                macro_rules! go {
                    ($r:literal) => {{
                        // SAFETY: `dot_rows` runs this only where `use_avx2()` holds; group g
                        // and activation rows i..i + $r <= m exist, with w.nb blocks each.
                        let v = unsafe { avx2::tile_group::<$r>(w, g, xq, i) };
                        for (r, lanes) in v.iter().enumerate() {
                            for (c, &v) in lanes.iter().enumerate() {
                                let j = g * GROUP + c;
                                if j < (j0 + nj) {
                                    store(i + r, j, v);
                                }
                            }
                        }
                    }};
                }
                match GROUP_TILE_R.min(i1 - i) {
                    4 => go!(4),
                    3 => go!(3),
                    2 => go!(2),
                    _ => go!(1),
                }
            }
        }
    }
}

/// The portable kernel: one output with ggml's block arithmetic in one lane (its rounding
/// differs from the AVX2 tiles', which sum in vector lanes).
fn dot_portable(w: &QuantMatrix, j: usize, x: &Q8Rows, i: usize) -> f32 {
    let (nb, nbp) = (w.nb, w.nbp);
    let (mut sum, mut offs) = (0.0f32, 0.0f32);
    for b in 0..nb {
        let (d, m, q) = w.block(j, b);
        let q = &q[..w.quant_bytes()];
        let y = &x.qs[(i * nb + b) * QK..(i * nb + b + 1) * QK];
        let (dx, sx) = (x.d[i * nbp + b], x.s[i * nbp + b]);
        let sumi: i32 = match w.ty {
            GgmlType::Q8_0 => q
                .iter()
                .zip(y)
                .map(|(&q, &y)| q as i8 as i32 * y as i32)
                .sum(),
            _ => (0..QK / 2)
                .map(|t| {
                    (q[t] & 0x0F) as i32 * y[t] as i32 + (q[t] >> 4) as i32 * y[t + QK / 2] as i32
                })
                .sum(),
        };
        sum += sumi as f32 * (d * dx);
        offs += match w.ty {
            GgmlType::Q4_0 => -8.0 * d * sx,
            GgmlType::Q4_1 => m * sx,
            _ => 0.0,
        };
    }
    sum + offs
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
