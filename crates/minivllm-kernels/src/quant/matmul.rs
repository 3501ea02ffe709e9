//! Linear layers over weights kept in their GGML block format.
//!
//! Every row of `x` is quantised once to 8-bit blocks of 32 (ggml's Q8_0/Q8_1,
//! `activations`; for K-quant weights a super-block's 8 blocks share one scale, as
//! ggml's Q8_K) and every output is an integer dot product of blocks, as llama.cpp computes
//! ([`super::reference`] has ggml's reference formulas). Decoding a few
//! rows is bound by reading the weights (`layout`), which stay 4-8x smaller than
//! f32; many rows (prefill) run the same products in tiles (`tiles`: 8 activation
//! rows against 16 weight rows with AVX512-VNNI, 8 against 8 with 256-bit registers), so that
//! weights and activations are each unpacked once per tile.
//!
//! One path for every batch size is deliberate: each output is summed in an order that
//! depends only on its own row, so a sequence's logits are bit-for-bit the same whatever
//! else is batched with it. (An f32 path for large batches would be faster on AVX2, but it
//! would differ from this one by rounding, and 8-bit rounding of the next layer's inputs
//! amplifies such differences into different greedy tokens.)

use std::cell::RefCell;

use rayon::prelude::*;

use super::activations::{shared_blocks, Q8Rows};
use super::formats::{GgmlType, MXFP4_OFFSET, MXFP4_UNSIGNED, QK};
use super::kquants;
use super::layout::{GROUP, KSUB, LANES};
use super::reference::{self, BlockQ8};
#[cfg(target_arch = "x86_64")]
use super::tiles::{amx, avx2, avx512};
use crate::matmul::{rows_per_task, TASK_ALIGN};

pub use super::kernel::QKernel;
pub use super::layout::{mxfp4_scales_fit, QuantMatrix, QuantMatrixError};

/// Activation rows per 256-bit tile (each against `LANES` weight rows). Eight, though the
/// float accumulators then spill: unpacking a block's nibbles costs as much as its float
/// steps, and eight rows share it. On a Zen 1 EPYC, whose one integer multiply pipe also
/// takes much of the unpacking, 8 rows ran 1.04-1.11x the rate of 4 (Q4_K 83.7 -> 89.0,
/// Q6_K 63.3 -> 70.3 GOP/s at 64 rows; 6 rows in between) and an MoE prefill 1.12x.
const TILE_R: usize = 8;
/// Activation rows up to which the 256-bit tiles take both halves of a group in one pass
/// ([`avx2::tile_pair`]): on a Zen 1 EPYC, one row 1.13-1.34x the rate of a half at a time
/// (Q8_0 and Q4_0 at 95-98 % of the read bandwidth), two rows 1.0-1.15x; three rows'
/// accumulators for both halves spill (Q4_K 0.88x).
const PAIR_MAX_R: usize = 2;
/// Activation rows per 512-bit tile: AVX-512's 32 registers hold eight accumulators beside
/// a block's eight weight vectors, and each weight vector then meets twice the rows (Q4_1,
/// 16-512 rows: 1.3x the rate of 4-row tiles on a Zen 5-class EPYC; Q8_0 unchanged).
const WIDE_TILE_R: usize = 8;
/// Activation rows swept over each group of weight rows: with `k` up to a few thousand,
/// their blocks stay in L2.
const X_CHUNK: usize = 64;
/// Bytes of quantised activation rows the AMX tiles sweep over each group: they unpack a
/// group's weights once per sweep, so it takes as many rows as stay in L2 beside them.
const AMX_X_BYTES: usize = 1 << 20;

// Parallel tasks write disjoint output columns only if every task starts at a tile's first
// weight row: a tile writes all the rows of its group (or half group, 256-bit), padding
// past the matrix aside. Tasks start at multiples of `TASK_ALIGN` (or take every row).
const _: () = assert!(TASK_ALIGN.is_multiple_of(GROUP) && GROUP.is_multiple_of(LANES));

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
    xq.quantize(x, m, w.nb, shared_blocks(w));
    if unsigned_activations(w, m, kernel) {
        xq.make_unsigned();
    }
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

/// One parallel task of [`matmul_quant_grouped`]: a group, and a run of its weight rows.
#[derive(Clone, Copy)]
struct GroupTask {
    group: usize,
    j0: usize,
    nj: usize,
    out: SendPtr,
}

thread_local! {
    /// Each group's quantised rows and the tasks of [`matmul_quant_grouped`], kept between
    /// calls.
    static GROUPED: RefCell<(Vec<Q8Rows>, Vec<GroupTask>)> = RefCell::new(Default::default());
}

/// Several products in one parallel loop, as a Mixture-of-Experts layer runs its experts:
/// rows `offsets[g]..offsets[g + 1]` of `x` (`[rows, cols]`) times `weight(g)`'s
/// transpose into the same rows of `out` (`[rows, out_cols]`), for every group `g`
/// (`offsets.len() - 1` of them; a group without rows is skipped and its weight not read).
/// Every weight is `[out_cols, cols]`.
///
/// One fork and join for all the groups instead of one per group (a decode step's 8
/// experts would otherwise take 8 per projection), and the threads share every group's
/// weight rows, so a group with more rows does not leave a core idle while others wait.
/// Each output is what [`matmul_quant`] computes for it, to the bit.
pub fn matmul_quant_grouped<'w>(
    x: &[f32],
    out: &mut [f32],
    offsets: &[usize],
    cols: usize,
    out_cols: usize,
    weight: &(dyn Fn(usize) -> &'w QuantMatrix + Sync),
) {
    let groups = offsets.len().saturating_sub(1);
    let rows = offsets.last().copied().unwrap_or(0);
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]),
        "matmul_quant_grouped: offsets must not decrease"
    );
    assert_eq!(
        x.len(),
        rows * cols,
        "matmul_quant_grouped: x must be [{rows}, {cols}]"
    );
    assert_eq!(
        out.len(),
        rows * out_cols,
        "matmul_quant_grouped: out must be [{rows}, {out_cols}]"
    );
    let (mut xqs, mut tasks) = GROUPED.take();
    if xqs.len() < groups {
        xqs.resize_with(groups, Q8Rows::default);
    }
    tasks.clear();
    let threads = rayon::current_num_threads();
    let kernel = QKernel::best();
    for g in 0..groups {
        let (r0, r1) = (offsets[g], offsets[g + 1]);
        if r0 == r1 {
            continue;
        }
        let w = weight(g);
        assert_eq!(
            (w.rows, w.cols),
            (out_cols, cols),
            "matmul_quant_grouped: group {g}'s weight must be [{out_cols}, {cols}]"
        );
        let m = r1 - r0;
        xqs[g].quantize(&x[r0 * cols..r1 * cols], m, w.nb, shared_blocks(w));
        if unsigned_activations(w, m, kernel) {
            xqs[g].make_unsigned();
        }
        let per_task = rows_per_task(m, cols, out_cols, threads);
        // SAFETY (of the pointer's later use): rows r0..r1 of `out` are this group's alone.
        let group_out = SendPtr(out[r0 * out_cols..].as_mut_ptr());
        for j0 in (0..out_cols).step_by(per_task.max(1)) {
            tasks.push(GroupTask {
                group: g,
                j0,
                nj: per_task.min(out_cols - j0),
                out: group_out,
            });
        }
    }
    let run = |t: &GroupTask| {
        let (w, m) = (weight(t.group), offsets[t.group + 1] - offsets[t.group]);
        dot_rows(&xqs[t.group], w, t.out, m, t.j0, t.nj, kernel);
    };
    if tasks.len() == 1 {
        run(&tasks[0]);
    } else {
        tasks.par_iter().for_each(run);
    }
    GROUPED.set((xqs, tasks));
}

/// Activation rows from which the 512-bit Q6_K tile takes them unsigned, against its quants
/// less 32 ([`QuantMatrix`]'s `q6_offsets`; `tiles::avx512`). On a Zen 4 EPYC, 2 threads,
/// best of interleaved runs against the signed tile: 8 and 64 rows x 2048 x 8192 1.07x and
/// 1.06x, 512 x 1536 x 8960 1.03-1.05x, a 152k-token LM head at 64 rows 1.01-1.04x; 4 rows
/// 0.97x (a block's unpacking, which gains a subtraction per vector, shared by fewer rows).
/// One-row decoding, bound by reading the weights, would also read the offsets.
const Q6_UNSIGNED_MIN_ROWS: usize = 8;

/// Whether `m` rows of activations go into `w`'s products unsigned ([`Q8Rows::make_unsigned`]):
/// Q6_K sharing its activations' super-block scales, on the 512-bit tiles (AMX's take the
/// signed quants, and its leftover rows run the 512-bit tiles on the same rows).
fn unsigned_activations(w: &QuantMatrix, m: usize, kernel: QKernel) -> bool {
    kernel == QKernel::Avx512Vnni
        && w.ty == GgmlType::Q6_K
        && !w.block_activations
        && m >= Q6_UNSIGNED_MIN_ROWS
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

/// [`dot_rows`] on x86 (`j0` a multiple of [`GROUP`], as the assertion on `TASK_ALIGN`
/// ensures): whole groups with AVX512-VNNI (and AMX, 16 activation rows at a time,
/// the rest of a chunk by AVX512-VNNI), half groups with the 256-bit kernels.
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
    let amx = kernel == QKernel::Amx;
    let wide = amx || kernel == QKernel::Avx512Vnni;
    let (unit, tile_r) = if wide {
        (GROUP, WIDE_TILE_R)
    } else {
        (LANES, TILE_R)
    };
    // A tile's row of results, less the padding rows past the task's last column.
    let put = |i: usize, j: usize, v: &[f32]| store_run(i, j, &v[..v.len().min(j0 + nj - j)]);
    // Configured once for every tile of the call; nothing else runs on this thread until it
    // is dropped, as nothing below yields to rayon.
    // SAFETY: `QKernel::Amx` is available only where `amx::available` holds.
    let tiles =
        (amx && m >= amx::TILE_ROWS && amx::takes(w)).then(|| unsafe { amx::Tiles::new(w.ty) });
    let mut unpacked = if tiles.is_some() {
        AMX_GROUP.take()
    } else {
        Default::default()
    };
    let chunk = if tiles.is_some() {
        (AMX_X_BYTES / w.cols.max(1)).max(X_CHUNK)
    } else {
        X_CHUNK
    };
    for i0 in (0..m).step_by(chunk) {
        let i1 = (i0 + chunk).min(m);
        if !wide && i1 - i0 <= PAIR_MAX_R {
            // Decoding one or two sequences: both halves of each group in one pass.
            for g in j0 / GROUP..(j0 + nj).div_ceil(GROUP) {
                macro_rules! pair {
                    ($r:literal) => {{
                        // SAFETY: as for every tile below; group g exists, rows being
                        // padded to whole groups.
                        let [lo, hi] = unsafe { avx2::tile_pair::<$r>(kernel, w, g, xq, i0) };
                        put_tile(&lo, i0, g * GROUP, &put);
                        if g * GROUP + LANES < j0 + nj {
                            put_tile(&hi, i0, g * GROUP + LANES, &put);
                        }
                    }};
                }
                match i1 - i0 {
                    2 => pair!(2),
                    _ => pair!(1),
                }
            }
            continue;
        }
        for u in j0 / unit..(j0 + nj).div_ceil(unit) {
            // SAFETY: AMX CPUs have AVX512-F and -BW; group u exists.
            let bq = (tiles.is_some() && i1 - i0 >= amx::TILE_ROWS)
                .then(|| unsafe { unpacked.unpack(w, u) });
            let mut i = i0;
            while i < i1 {
                // Every tile's contract: `kernel` is available (`QKernel::best` or a caller
                // that checked); group (or half group) u exists, rows being padded to whole
                // groups, and so do activation rows i..i + R <= m, with w.nb blocks each.
                if let (Some(tiles), Some(bq)) = (&tiles, bq.filter(|_| i1 - i >= amx::TILE_ROWS)) {
                    // SAFETY: as said above; AMX CPUs have AVX512-VNNI.
                    let v = unsafe { amx::tile_group(tiles, w, u, bq, xq, i) };
                    put_tile(&v, i, u * GROUP, put);
                    i += amx::TILE_ROWS;
                    continue;
                }
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
                        let v = unsafe { avx2::tile_group::<$r>(kernel, w, u, xq, i) };
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
                    (false, 8) => narrow!(8),
                    (false, 7) => narrow!(7),
                    (false, 6) => narrow!(6),
                    (false, 5) => narrow!(5),
                    (false, 4) => narrow!(4),
                    (false, 3) => narrow!(3),
                    (false, 2) => narrow!(2),
                    (false, _) => narrow!(1),
                }
                i += tile_r.min(i1 - i);
            }
        }
    }
    if tiles.is_some() {
        AMX_GROUP.set(unpacked);
    }
}

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The AMX tiles' unpacked weight group, kept between calls.
    static AMX_GROUP: std::cell::Cell<amx::GroupTiles> = std::cell::Cell::new(Default::default());
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
    /// K-quants with shared activation scales: each block's integer scale and minimum
    /// (Q6_K: its halves' scales), and each super-block's `d` and `dmin` (their tiles'
    /// integer sums per super-block).
    sub: Vec<[i32; 2]>,
    sup: Vec<[f32; 2]>,
}

impl PortableRow {
    /// Unpacks row `j` of `w`, reusing the buffers.
    fn unpack(&mut self, w: &QuantMatrix, j: usize) {
        self.q.clear();
        self.scales.clear();
        self.offset.clear();
        self.sub.clear();
        self.sup.clear();
        for b in 0..w.nb {
            if kquants::is_kquant(w.ty) {
                let at = w.super_index(j, b / KSUB);
                let d = w.d[at].to_f32();
                let (s0, s1, q) = w.k_block(j, b);
                self.q.push(q);
                if shared_blocks(w) > 1 {
                    let six = w.ty == GgmlType::Q6_K;
                    // Q6_K's scales are signed; the others' a 6-bit scale and minimum.
                    self.sub.push(if six {
                        [s0 as i8 as i32, s1 as i8 as i32]
                    } else {
                        [s0 as i32, s1 as i32]
                    });
                    if b % KSUB == 0 {
                        self.sup
                            .push([d, if six { 0.0 } else { w.mins[at].to_f32() }]);
                    }
                } else if w.ty == GgmlType::Q6_K {
                    self.scales.push([d * s0 as i8 as f32, d * s1 as i8 as f32]);
                    self.offset.push(0.0);
                } else {
                    self.scales.push([d * s0 as f32; 2]);
                    self.offset.push(-(w.mins[at].to_f32() * s1 as f32));
                }
                continue;
            }
            let (d, m, q) = w.block(j, b);
            self.q.push(match w.ty {
                GgmlType::MXFP4 => q.map(|n| MXFP4_UNSIGNED[usize::from(n)]),
                _ => q,
            });
            self.scales.push([d; 2]);
            self.offset.push(match w.ty {
                GgmlType::Q4_0 => -8.0 * d,
                GgmlType::MXFP4 => -MXFP4_OFFSET * d,
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
        if shared_blocks(w) > 1 {
            return self.dot_super_blocks(w.ty, nb, x, i);
        }
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
                let [olo, ohi] = x.offsets[at];
                sum += (isum(0..QK / 2) + olo) as f32 * (dlo * x.d[at]);
                sum += (isum(QK / 2..QK) + ohi) as f32 * (dhi * x.d[at]);
            } else {
                sum += isum(0..QK) as f32 * (dlo * x.d[at]);
                offs += self.offset[b] * x.s[at];
            }
        }
        sum + offs
    }

    /// [`PortableRow::dot`] for the K-quants, as their tiles: per super-block, the
    /// blocks' integer sums times their scales and the activations' block sums times the
    /// minima (Q6_K: each half's sum times its scale, and its `-32` times the activations'
    /// half sums), exact, then the floats `d`, `dmin` and `dx` once.
    fn dot_super_blocks(&self, ty: GgmlType, nb: usize, x: &Q8Rows, i: usize) -> f32 {
        let mut sum = 0.0f32;
        for (sb, &[d, dmin]) in self.sup.iter().enumerate() {
            let (mut isum, mut mins) = (0i32, 0i32);
            for b in sb * KSUB..(sb + 1) * KSUB {
                let y = &x.qs[(i * nb + b) * QK..(i * nb + b + 1) * QK];
                let dot = |r: std::ops::Range<usize>| -> i32 {
                    r.map(|t| self.q[b][t] as i32 * y[t] as i32).sum()
                };
                let [s0, s1] = self.sub[b];
                if ty == GgmlType::Q6_K {
                    let [lo, hi] = x.half_sums[i * nb + b];
                    isum += s0 * (dot(0..QK / 2) - 32 * lo as i32)
                        + s1 * (dot(QK / 2..QK) - 32 * hi as i32);
                } else {
                    isum += s0 * dot(0..QK);
                    mins += s1 * x.qsum[i * nb + b] as i32;
                }
            }
            let dx = x.d[i * nb + sb * KSUB];
            sum += if ty == GgmlType::Q6_K {
                isum as f32 * (d * dx)
            } else {
                (isum as f32 * d - mins as f32 * dmin) * dx
            };
        }
        sum
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
        reference::quantize_row_q8_shared(xr, &mut xq, shared_blocks(w));
        for (o, wr) in orow.iter_mut().zip(&rows) {
            *o = reference::vec_dot_scalar(w.ty, wr, &xq);
        }
    }
}

#[cfg(test)]
mod tests;
