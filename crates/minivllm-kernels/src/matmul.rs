//! Dense f32 matrix multiplication for linear layers.
//!
//! Both operands are row-major along `k`, so every output is a dot product of two
//! contiguous rows. The micro-kernel keeps an `MR × NR` tile of vector accumulators
//! (`MR` rows of `x` against `NR` rows of `w`), summing across lanes only once per `k`
//! block. Loop order keeps the `NR` weight rows in L1 while every row of an `MC`-row block
//! of `x` (in L2) passes over them, so decode streams each weight row from memory once and
//! prefill reuses it `MC` times.
//!
//! From `PACK_MIN_M` rows of `x` on (prefill), the weights are first copied into
//! `PKC × (PV·LANES)` column panels (`w` transposed), so the micro-kernel can broadcast one
//! `x` value against whole vectors of output columns: no lane sums, and every panel is
//! reused from L1 by all the rows of an `x` block.

use crate::simd::{simd_dispatch, Simd};

pub use crate::simd::dot_scalar;
use rayon::prelude::*;
use std::cell::RefCell;

/// Rows of `x` per micro-tile.
const MR: usize = 3;
/// Rows of `w` per micro-tile: `MR·NR` accumulators plus `MR` operands fill AVX2's 16 registers.
const NR: usize = 4;
/// Rows of `x` per L2 block (a multiple of `MR`).
const MC: usize = 72;
/// Longest `k` run per pass; longer rows are split so an `MC × KC` block of `x` fits in L2.
const KC: usize = 1024;
/// Rows of `x` per packed micro-tile.
const PR: usize = 6;
/// Vectors of output columns per packed micro-tile: `PR·PV` accumulators.
const PV: usize = 2;
/// `k` per packed panel: one `PKC × PV·LANES` panel (24 KiB with AVX2) stays in L1; longer
/// panels would mean fewer read-modify-write passes over `out`, but L1 misses.
const PKC: usize = 384;
/// Rows of `x` per L2 block in the packed path (a multiple of `PR`).
const PMC: usize = 120;
/// Columns packed at a time: `PACK_NC × PKC` floats (384 KiB) of panels, within L2.
const PACK_NC: usize = 256;
/// From this many rows of `x` on, copying the weights into panels pays for itself.
const PACK_MIN_M: usize = 32;
/// Task widths are a multiple of this, the widest panel (AVX-512), so panels are full; the
/// quantised kernels' tiles rest on it too (their rows must not straddle two tasks, which
/// `crate::quant::matmul` asserts at compile time).
pub(crate) const TASK_ALIGN: usize = 32;
/// Below this many multiply-adds, waking other threads costs more than it saves.
const PAR_MIN_WORK: usize = 1 << 17;
/// Fewest weight rows per task, so that each task streams a worthwhile amount of memory.
const PAR_MIN_ROWS: usize = 64;

/// `out[m, n] = x[m, k] · w[n, k]ᵀ`, threaded over the output columns.
pub fn matmul(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    check_shapes(x, w, out, m, k, n);
    let whole = Gemm::dense(x, w, out, m, k, n);
    let rows = rows_per_task(m, k, n, rayon::current_num_threads());
    if rows >= n {
        // SAFETY: the shapes were checked above.
        unsafe { gemm_nt_any(whole) };
        return;
    }
    let whole = SendGemm(whole);
    (0..n.div_ceil(rows)).into_par_iter().for_each(|t| {
        let j0 = t * rows;
        // SAFETY: shapes were checked; task t writes only columns j0..j0 + rows of every
        // output row, which no other task touches, and nothing else uses `out` meanwhile.
        unsafe { gemm_nt_any(whole.get().window(0, m, j0, rows.min(n - j0), 0, k)) };
    });
}

thread_local! {
    /// Packed weight panels, kept between calls so that prefill does not allocate.
    static PANELS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The packed or the dot-product kernel, whichever suits `g.m`.
///
/// # Safety
/// As [`gemm_nt`].
pub(crate) unsafe fn gemm_nt_any(g: Gemm) {
    if g.m >= PACK_MIN_M {
        PANELS.with_borrow_mut(|panels| {
            // Column blocks bound the panel buffer (and keep it in L2) however wide `w` is.
            for j0 in (0..g.n).step_by(PACK_NC) {
                let block = g.window(0, g.m, j0, PACK_NC.min(g.n - j0), 0, g.k);
                // SAFETY: forwarded contract; the block lies inside `g`.
                unsafe { gemm_nt_packed(block, panels) };
            }
        });
    } else {
        // SAFETY: forwarded contract.
        unsafe { gemm_nt(g) };
    }
}

/// Weight rows per parallel task (`>= n` means: run on the calling thread).
pub(crate) fn rows_per_task(m: usize, k: usize, n: usize, threads: usize) -> usize {
    if threads <= 1 || m * k * n < PAR_MIN_WORK {
        return n.max(1);
    }
    // A few tasks per thread evens out threads that other work slows down.
    let rows = n.div_ceil(4 * threads).max(PAR_MIN_ROWS);
    rows.next_multiple_of(TASK_ALIGN)
}

/// A [`Gemm`] that may cross to rayon's threads; users guarantee disjoint writes.
#[derive(Clone, Copy)]
pub(crate) struct SendGemm(pub(crate) Gemm);
// SAFETY: only used for disjoint writes and shared reads, as argued at the use.
unsafe impl Send for SendGemm {}
// SAFETY: as above.
unsafe impl Sync for SendGemm {}

impl SendGemm {
    // A method, not field access, so that closures capture the whole Send wrapper.
    pub(crate) fn get(self) -> Gemm {
        self.0
    }
}

fn check_shapes(x: &[f32], w: &[f32], out: &[f32], m: usize, k: usize, n: usize) {
    assert_eq!(x.len(), m * k, "matmul: x must be [m={m}, k={k}]");
    assert_eq!(w.len(), n * k, "matmul: w must be [n={n}, k={k}]");
    assert_eq!(out.len(), m * n, "matmul: out must be [m={m}, n={n}]");
}

/// Operands of one single-threaded strided product
/// `out[i·ldo + j] = Σ_{p<k} x[i·ldx + p] · w[j·ldw + p]` for `i < m`, `j < n`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gemm {
    pub x: *const f32,
    pub ldx: usize,
    pub w: *const f32,
    pub ldw: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Gemm {
    /// The product of whole row-major matrices `x[m, k]`, `w[n, k]`, `out[m, n]`.
    pub(crate) fn dense(
        x: &[f32],
        w: &[f32],
        out: &mut [f32],
        m: usize,
        k: usize,
        n: usize,
    ) -> Gemm {
        Gemm {
            x: x.as_ptr(),
            ldx: k,
            w: w.as_ptr(),
            ldw: k,
            out: out.as_mut_ptr(),
            ldo: n,
            m,
            n,
            k,
        }
    }

    /// The sub-product of rows `i..i + m` of `x`, rows `j..j + n` of `w` and `k` range
    /// `p..p + k`. Pointers are offset with `wrapping_add`, so this is safe to build; the
    /// result is valid when the window lies inside `self`.
    #[inline(always)]
    fn window(self, i: usize, m: usize, j: usize, n: usize, p: usize, k: usize) -> Gemm {
        Gemm {
            x: self.x.wrapping_add(i * self.ldx + p),
            w: self.w.wrapping_add(j * self.ldw + p),
            out: self.out.wrapping_add(i * self.ldo + j),
            m,
            n,
            k,
            ..self
        }
    }
}

simd_dispatch! {
    /// Single-threaded [`Gemm`].
    ///
    /// # Safety
    /// `x` must hold `m` readable rows of `k` at stride `ldx`, `w` `n` rows of `k` at stride
    /// `ldw`, `out` `m` writable rows of `n` at stride `ldo`, not overlapping `x` or `w`.
    pub(crate) unsafe fn gemm_nt(g: Gemm);
    generic = gemm_nt_generic;
    avx512 = crate::simd::Avx512;
    scalar = gemm_nt_portable;
}

/// [`gemm_nt`] for machines without SIMD kernels: the same blocking, one lane.
///
/// # Safety
/// As [`gemm_nt`].
unsafe fn gemm_nt_portable(g: Gemm) {
    // SAFETY: forwarded contract.
    unsafe { gemm_nt_generic(crate::simd::Scalar, g) }
}

/// # Safety
/// As [`gemm_nt`].
#[inline(always)]
pub(crate) unsafe fn gemm_nt_generic<S: Simd>(s: S, g: Gemm) {
    if g.k == 0 {
        for i in 0..g.m {
            for j in 0..g.n {
                // SAFETY: inside `out` by the contract.
                unsafe { *g.out.add(i * g.ldo + j) = 0.0 };
            }
        }
        return;
    }
    // Equal k blocks, so that a 1100-long row is not split into 1024 + 76.
    let kc =
        g.k.div_ceil(g.k.div_ceil(KC))
            .next_multiple_of(S::LANES)
            .min(g.k);
    let mut p0 = 0;
    while p0 < g.k {
        let kl = kc.min(g.k - p0);
        for i0 in (0..g.m).step_by(MC) {
            let mc = MC.min(g.m - i0);
            for j in (0..g.n).step_by(NR) {
                let nr = NR.min(g.n - j);
                let mut i = i0;
                while i < i0 + mc {
                    let mr = MR.min(i0 + mc - i);
                    // SAFETY: the window lies inside `g`.
                    unsafe { tile(s, g.window(i, mr, j, nr, p0, kl), p0 > 0) };
                    i += mr;
                }
            }
        }
        p0 += kl;
    }
}

/// Runs the micro-kernel for a (possibly edge) tile of at most `MR × NR`.
///
/// # Safety
/// As [`micro`].
#[inline(always)]
unsafe fn tile<S: Simd>(s: S, g: Gemm, accumulate: bool) {
    macro_rules! go {
        ($r:literal, $c:literal) => {
            // SAFETY: forwarded contract.
            unsafe { micro::<S, $r, $c>(s, g, accumulate) }
        };
    }
    match (g.m, g.n) {
        (3, 4) => go!(3, 4),
        (3, 3) => go!(3, 3),
        (3, 2) => go!(3, 2),
        (3, _) => go!(3, 1),
        (2, 4) => go!(2, 4),
        (2, 3) => go!(2, 3),
        (2, 2) => go!(2, 2),
        (2, _) => go!(2, 1),
        (_, 4) => go!(1, 4),
        (_, 3) => go!(1, 3),
        (_, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// An `R × C` tile over `g.k` (`g.m`, `g.n` are ignored); adds to `out` if `accumulate`.
///
/// # Safety
/// As [`gemm_nt`] with `m = R`, `n = C`.
// A register tile indexes the rows, the columns and the accumulators in step; the
// rust-version's clippy (1.89) asks for iterators there.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn micro<S: Simd, const R: usize, const C: usize>(s: S, g: Gemm, accumulate: bool) {
    // Dev builds keep debug assertions, which check every `ptr.add` and `+`: the hot loop
    // uses precomputed row pointers and `wrapping_add` so it compiles to bare loads and FMAs.
    let xr: [*const f32; R] = std::array::from_fn(|i| g.x.wrapping_add(i * g.ldx));
    let wr: [*const f32; C] = std::array::from_fn(|j| g.w.wrapping_add(j * g.ldw));
    let k = g.k;
    let kv = k - k % S::LANES;
    let mut acc = [[s.zero(); C]; R];
    let mut p = 0;
    // SAFETY (all accesses below): p + LANES <= k in the loop, q < k in the tail, i < R,
    // j < C, which the contract covers.
    while p < kv {
        // Not `array::from_fn`: its closure would not get the caller's target features.
        let mut xv = [s.zero(); R];
        for i in 0..R {
            // SAFETY: in bounds, as stated above for this function's accesses.
            xv[i] = unsafe { s.load(xr[i].wrapping_add(p)) };
        }
        for j in 0..C {
            // SAFETY: in bounds, as stated above for this function's accesses.
            let wv = unsafe { s.load(wr[j].wrapping_add(p)) };
            for i in 0..R {
                acc[i][j] = s.fma(xv[i], wv, acc[i][j]);
            }
        }
        p = p.wrapping_add(S::LANES);
    }
    for i in 0..R {
        let mut sums = [0.0f32; C];
        if C == 4 {
            // One combined reduction instead of four: with short rows (attention's head_dim)
            // the lane sums are a real share of the work.
            let four = s.hsum4([acc[i][0], acc[i][1 % C], acc[i][2 % C], acc[i][3 % C]]);
            sums.copy_from_slice(&four[..C]);
        } else {
            for j in 0..C {
                sums[j] = s.hsum(acc[i][j]);
            }
        }
        for (j, &sum) in sums.iter().enumerate() {
            let mut v = sum;
            for q in kv..k {
                // SAFETY: in bounds, as stated above for this function's accesses.
                v += unsafe { *xr[i].add(q) * *wr[j].add(q) };
            }
            // SAFETY: in bounds, as stated above for this function's accesses.
            let o = unsafe { &mut *g.out.add(i * g.ldo + j) };
            *o = if accumulate { *o + v } else { v };
        }
    }
}

simd_dispatch! {
    /// Single-threaded [`Gemm`] through packed weight panels (`panels` is scratch).
    ///
    /// # Safety
    /// As [`gemm_nt`].
    unsafe fn gemm_nt_packed(g: Gemm, panels: &mut Vec<f32>);
    generic = gemm_nt_packed_generic;
    avx512 = crate::simd::Avx512;
    scalar = gemm_nt_packed_portable;
}

/// # Safety
/// As [`gemm_nt`].
unsafe fn gemm_nt_packed_portable(g: Gemm, panels: &mut Vec<f32>) {
    // SAFETY: forwarded contract.
    unsafe { gemm_nt_packed_generic(crate::simd::Scalar, g, panels) }
}

/// # Safety
/// As [`gemm_nt`].
#[inline(always)]
unsafe fn gemm_nt_packed_generic<S: Simd>(s: S, g: Gemm, panels: &mut Vec<f32>) {
    if g.k == 0 || g.m == 0 || g.n == 0 {
        // SAFETY: forwarded contract.
        return unsafe { gemm_nt_generic(s, g) };
    }
    let width = PV * S::LANES;
    let num_panels = g.n.div_ceil(width);
    let kc = g.k.div_ceil(g.k.div_ceil(PKC));
    // Every element is rewritten by `pack`, so old contents need no clearing.
    panels.resize(num_panels * kc * width, 0.0);
    let mut p0 = 0;
    while p0 < g.k {
        let kl = kc.min(g.k - p0);
        // SAFETY: rows 0..n of `w`, k range p0..p0 + kl, are inside `g`.
        unsafe { pack(s, g, p0, kl, width, panels) };
        for i0 in (0..g.m).step_by(PMC) {
            let mc = PMC.min(g.m - i0);
            for (jp, panel) in panels.chunks_exact(kl * width).take(num_panels).enumerate() {
                let j = jp * width;
                let mut i = i0;
                while i < i0 + mc {
                    let r = PR.min(i0 + mc - i);
                    let t = g.window(i, r, j, width.min(g.n - j), p0, kl);
                    // SAFETY: the window lies inside `g`; `panel` holds kl × width floats.
                    unsafe { packed_tile(s, t, panel.as_ptr(), p0 > 0) };
                    i += r;
                }
            }
        }
        p0 += kl;
    }
}

/// Copies `w` rows `0..g.n`, k range `p0..p0 + kl`, into panels of `width` columns:
/// panel `jp` holds `[kl][width]` with column `c` = row `jp·width + c` of `w` (zero past `n`).
///
/// # Safety
/// `g.w` must hold `g.n` readable rows of at least `p0 + kl` at stride `g.ldw`.
#[inline(always)]
unsafe fn pack<S: Simd>(s: S, g: Gemm, p0: usize, kl: usize, width: usize, panels: &mut [f32]) {
    let num_panels = g.n.div_ceil(width);
    for (jp, panel) in panels
        .chunks_exact_mut(kl * width)
        .take(num_panels)
        .enumerate()
    {
        let j0 = jp * width;
        let cols = width.min(g.n - j0);
        let base = g.w.wrapping_add(j0 * g.ldw + p0);
        // 8 × 8 blocks transposed in registers, then the ragged edges one by one.
        let (c8, p8) = (cols - cols % 8, kl - kl % 8);
        for p in (0..p8).step_by(8) {
            for c in (0..c8).step_by(8) {
                // SAFETY: rows j0 + c..j0 + c + 8 <= n and elements p0 + p..p0 + p + 8 <= p0 + kl
                // by the contract; the panel holds kl × width floats.
                unsafe {
                    s.transpose8(
                        base.wrapping_add(c * g.ldw + p),
                        g.ldw,
                        panel.as_mut_ptr().wrapping_add(p * width + c),
                        width,
                    )
                };
            }
        }
        for (p, dst) in panel.chunks_exact_mut(width).enumerate() {
            let first = if p < p8 { c8 } else { 0 };
            for (c, d) in dst[..cols].iter_mut().enumerate().skip(first) {
                // SAFETY: row j0 + c < n, element p0 + p < p0 + kl, by the contract.
                *d = unsafe { *base.wrapping_add(c * g.ldw + p) };
            }
            dst[cols..].fill(0.0);
        }
    }
}

/// Picks the packed micro-kernel for a tile of `g.m <= PR` rows.
///
/// # Safety
/// As [`packed_micro`].
#[inline(always)]
unsafe fn packed_tile<S: Simd>(s: S, g: Gemm, panel: *const f32, accumulate: bool) {
    macro_rules! go {
        ($r:literal) => {
            // SAFETY: forwarded contract.
            unsafe { packed_micro::<S, $r>(s, g, panel, accumulate) }
        };
    }
    match g.m {
        6 => go!(6),
        5 => go!(5),
        4 => go!(4),
        3 => go!(3),
        2 => go!(2),
        _ => go!(1),
    }
}

/// `R` rows of `x` against one panel: `out[i, 0..g.n] (+)= Σ_p x[i, p] · panel[p, ..]`.
///
/// # Safety
/// `g.x`: `R` readable rows of `g.k` at stride `g.ldx`; `panel`: `g.k × PV·LANES` floats;
/// `g.out`: `R` writable rows of `g.n <= PV·LANES` at stride `g.ldo`.
#[allow(clippy::needless_range_loop)] // as `micro`'s tile
#[inline(always)]
unsafe fn packed_micro<S: Simd, const R: usize>(
    s: S,
    g: Gemm,
    panel: *const f32,
    accumulate: bool,
) {
    let l = S::LANES;
    let width = PV * l;
    let mut xr = [g.x; R];
    for (i, xr) in xr.iter_mut().enumerate() {
        *xr = g.x.wrapping_add(i * g.ldx);
    }
    // The output tile is read at the end: start fetching it now, behind the FMAs.
    for i in 0..R {
        let o = g.out.wrapping_add(i * g.ldo);
        s.prefetch(o);
        s.prefetch(o.wrapping_add(width - 1));
    }
    let mut acc = [[s.zero(); PV]; R];
    let mut wp = panel;
    // SAFETY (all accesses below): p < k, v < PV, i < R, c < g.n, within the contract.
    for p in 0..g.k {
        let mut wv = [s.zero(); PV];
        for (v, wv) in wv.iter_mut().enumerate() {
            // SAFETY: in bounds, as stated above for this function's accesses.
            *wv = unsafe { s.load(wp.wrapping_add(v * l)) };
        }
        for i in 0..R {
            // SAFETY: in bounds, as stated above for this function's accesses.
            let xb = s.splat(unsafe { *xr[i].wrapping_add(p) });
            for v in 0..PV {
                acc[i][v] = s.fma(xb, wv[v], acc[i][v]);
            }
        }
        wp = wp.wrapping_add(width);
    }
    for (i, acc) in acc.iter().enumerate() {
        let o = g.out.wrapping_add(i * g.ldo);
        if g.n == width {
            for (v, &a) in acc.iter().enumerate() {
                let po = o.wrapping_add(v * l);
                // SAFETY: in bounds, as stated above for this function's accesses.
                unsafe { s.store(po, if accumulate { s.add(s.load(po), a) } else { a }) };
            }
        } else {
            // The last, narrower panel: spill and copy only the columns that exist.
            let mut tmp = [0.0f32; 64];
            debug_assert!(width <= tmp.len());
            for (v, &a) in acc.iter().enumerate() {
                // SAFETY: in bounds, as stated above for this function's accesses.
                unsafe { s.store(tmp.as_mut_ptr().wrapping_add(v * l), a) };
            }
            for (c, &t) in tmp[..g.n].iter().enumerate() {
                // SAFETY: in bounds, as stated above for this function's accesses.
                let dst = unsafe { &mut *o.add(c) };
                *dst = if accumulate { *dst + t } else { t };
            }
        }
    }
}

/// Single-threaded reference for [`matmul`].
pub fn matmul_scalar(x: &[f32], w: &[f32], out: &mut [f32], m: usize, k: usize, n: usize) {
    check_shapes(x, w, out, m, k, n);
    if k == 0 {
        out.fill(0.0);
        return;
    }
    for (xr, orow) in x.chunks_exact(k).zip(out.chunks_exact_mut(n.max(1))) {
        for (o, wr) in orow.iter_mut().zip(w.chunks_exact(k)) {
            *o = dot_scalar(xr, wr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn reference(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k)
                    .map(|p| x[i * k + p] as f64 * w[j * k + p] as f64)
                    .sum();
                out[i * n + j] = s as f32;
            }
        }
        out
    }

    #[test]
    fn scalar_matches_f64_reference() {
        let mut r = rng(1);
        for &(m, k, n) in &[(1, 1, 1), (1, 7, 3), (3, 17, 5), (4, 64, 9)] {
            let x = rand_vec(&mut r, m * k);
            let w = rand_vec(&mut r, n * k);
            let mut out = vec![0.0; m * n];
            matmul_scalar(&x, &w, &mut out, m, k, n);
            let tol = 1e-5 * (k as f32).sqrt();
            assert_close(&out, &reference(&x, &w, m, k, n), tol, tol, "matmul_scalar");
        }
    }

    /// Shapes covering every edge tile, k tails of every length and the threaded path.
    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (1, 7, 1),
        (1, 576, 1536),
        (2, 9, 3),
        (3, 16, 4),
        (4, 31, 5),
        (5, 33, 6),
        (7, 100, 7),
        (1, 17, 130),
        (74, 65, 9),
        (150, 40, 11),
        (6, 1100, 257),
        (33, 300, 1000),
        (64, 576, 96),
        (37, 513, 70),
        (40, 20, 600),
    ];

    /// Runs `f` on every shape and compares with [`matmul_scalar`] within float-reordering
    /// tolerance.
    fn check_against_scalar(
        seed: u64,
        what: &str,
        f: impl Fn(&[f32], &[f32], &mut [f32], usize, usize, usize),
    ) {
        let mut r = rng(seed);
        for &(m, k, n) in SHAPES {
            let x = rand_vec(&mut r, m * k);
            let w = rand_vec(&mut r, n * k);
            let mut want = vec![0.0; m * n];
            matmul_scalar(&x, &w, &mut want, m, k, n);
            let mut got = vec![f32::NAN; m * n];
            f(&x, &w, &mut got, m, k, n);
            // Sums of k products of magnitude <= 1: error grows like sqrt(k) ulps of the terms.
            let tol = 1e-5 * (k as f32).sqrt();
            assert_close(&got, &want, tol, tol, &format!("{what} m={m} k={k} n={n}"));
        }
    }

    #[test]
    fn dispatch_matches_scalar() {
        check_against_scalar(11, "matmul", matmul);
    }

    #[test]
    fn single_thread_driver_matches_scalar() {
        // Wide shapes here cross several PACK_NC column blocks on one thread.
        // SAFETY: in bounds, as stated above for this function's accesses.
        check_against_scalar(16, "gemm_nt_any", |x, w, out, m, k, n| unsafe {
            gemm_nt_any(Gemm::dense(x, w, out, m, k, n))
        });
    }

    #[test]
    fn portable_kernel_matches_scalar() {
        // SAFETY: in bounds, as stated above for this function's accesses.
        check_against_scalar(12, "gemm_nt_portable", |x, w, out, m, k, n| unsafe {
            gemm_nt_portable(Gemm::dense(x, w, out, m, k, n))
        });
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_kernels_match_scalar() {
        fn run<S: Simd>(s: S) {
            // SAFETY: in bounds, as stated above for this function's accesses.
            check_against_scalar(13, "gemm_nt_generic", |x, w, out, m, k, n| unsafe {
                gemm_nt_generic(s, Gemm::dense(x, w, out, m, k, n))
            });
        }
        if let Some(s) = crate::simd::Avx2::new() {
            run(s);
        }
        if let Some(s) = crate::simd::Avx512::new() {
            run(s);
        }
    }

    #[test]
    fn packed_kernels_match_scalar() {
        fn run<S: Simd>(s: S) {
            // A panel buffer reused across shapes, as the thread-local one is.
            let panels = RefCell::new(Vec::new());
            // SAFETY: in bounds, as stated above for this function's accesses.
            check_against_scalar(15, "gemm_nt_packed_generic", |x, w, out, m, k, n| unsafe {
                gemm_nt_packed_generic(s, Gemm::dense(x, w, out, m, k, n), &mut panels.borrow_mut())
            });
        }
        run(crate::simd::Scalar);
        #[cfg(target_arch = "x86_64")]
        if let Some(s) = crate::simd::Avx2::new() {
            run(s);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(s) = crate::simd::Avx512::new() {
            run(s);
        }
    }

    #[test]
    fn strided_operands() {
        // A 3×5 window of out (stride 9) from x and w windows with padded strides.
        let mut r = rng(14);
        let (m, n, k, ldx, ldw, ldo) = (3, 5, 11, 13, 12, 9);
        let x = rand_vec(&mut r, m * ldx);
        let w = rand_vec(&mut r, n * ldw);
        let mut out = vec![7.0; m * ldo];
        let g = Gemm {
            x: x.as_ptr(),
            ldx,
            w: w.as_ptr(),
            ldw,
            out: out.as_mut_ptr(),
            ldo,
            m,
            n,
            k,
        };
        // SAFETY: in bounds, as stated above for this function's accesses.
        unsafe { gemm_nt(g) };
        for i in 0..m {
            for j in 0..ldo {
                let got = out[i * ldo + j];
                if j < n {
                    let want = dot_scalar(&x[i * ldx..][..k], &w[j * ldw..][..k]);
                    assert!((got - want).abs() < 1e-5, "({i},{j}): {got} vs {want}");
                } else {
                    assert_eq!(got, 7.0, "({i},{j}) outside the window was written");
                }
            }
        }
    }

    #[test]
    fn task_split() {
        assert_eq!(rows_per_task(1, 10, 10, 2), 10);
        assert_eq!(rows_per_task(512, 576, 1536, 1), 1536);
        let rows = rows_per_task(512, 576, 1536, 2);
        assert!(
            rows.is_multiple_of(TASK_ALIGN)
                && rows >= PAR_MIN_ROWS
                && 1536usize.div_ceil(rows) >= 4
        );
        assert_eq!(rows_per_task(1, 576, 1536, 2), 192);
        assert_eq!(rows_per_task(1, 576, 960, 2), 128);
    }

    #[test]
    fn empty_shapes_do_not_panic() {
        let mut out = vec![1.0; 6];
        matmul(&[], &[], &mut out, 2, 0, 3);
        assert!(out.iter().all(|&v| v == 0.0));
        matmul(&[], &[0.0; 4], &mut [], 0, 2, 2);
        matmul(&[0.0; 4], &[], &mut [], 2, 2, 0);
        // The packed path (m >= PACK_MIN_M) with nothing to sum.
        let mut out = vec![1.0; 40 * 3];
        matmul(&[], &[], &mut out, 40, 0, 3);
        assert!(out.iter().all(|&v| v == 0.0));
    }
}
