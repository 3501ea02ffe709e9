//! The x86 tiles of [`super::matmul_quant`]: `R` activation rows against one unit of weight
//! rows, a half group in 256-bit registers ([`avx2`]) or a whole group in 512-bit ones
//! ([`avx512`]; [`amx`] runs their integer products on the AMX tile unit), lane `c` of each register holding weight row `c` of the unit.
//!
//! The per-format arithmetic (unpacking nibbles and the bits above them, applying the
//! scales, widening the integer sums in time) is written once here, generic over the
//! format ([`QuantFormat`]) and over the register width ([`Width`]): the two widths once
//! held two copies of it that had to be kept in step by hand. The ISA files supply the
//! vector operations, the Q8_0 tile (whose signed quants each width handles its own way) and
//! the entry points that enable their CPU features. Every lane's sum runs in block order
//! whatever `R` and whatever the width, so a row's result depends neither on its batch nor
//! on the instruction set.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

use half::f16;

use super::activations::Q8Rows;
use super::formats::{self, GgmlType, QuantFormat, Scales, QK};
use super::layout::{hbits_bytes, sub_bytes, QuantMatrix, GROUP, KSUB, VEC_BYTES};

/// Runs `$body` with `$r` = 0, 1, .. `$rows - 1` (at most 8), unrolled: each row's (or
/// unit's) accumulator then stays in a register. LLVM left Q6_K's larger loop body rolled, its
/// accumulators on the stack (a store and a reload per row and block): 1.3x the time of
/// Q4_K's tile where the work differs by a tenth.
macro_rules! for_each_row {
    ($rows:expr, $r:ident, $body:block) => {{
        const { assert!($rows <= 8) };
        if 0 < $rows {
            let $r = 0;
            $body
        }
        if 1 < $rows {
            let $r = 1;
            $body
        }
        if 2 < $rows {
            let $r = 2;
            $body
        }
        if 3 < $rows {
            let $r = 3;
            $body
        }
        if 4 < $rows {
            let $r = 4;
            $body
        }
        if 5 < $rows {
            let $r = 5;
            $body
        }
        if 6 < $rows {
            let $r = 6;
            $body
        }
        if 7 < $rows {
            let $r = 7;
            $body
        }
    }};
}

pub(super) mod amx;
pub(super) mod avx2;
pub(super) mod avx512;

/// One register width's vector operations, as the tiles use them: 32-bit lanes, one weight
/// row each.
///
/// # Safety
/// Every method needs the CPU features its implementation names; those that read through
/// a pointer say what must be readable.
pub(super) trait Width {
    /// Weight rows per tile: lanes per register.
    const ROWS: usize;
    /// Integer (byte or 32-bit lane) vector.
    type I: Copy;
    /// f32 vector.
    type F: Copy;
    /// A tile row's results, `[f32; ROWS]`.
    type Out: Copy + Default;

    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat_i8(v: i8) -> Self::I;
    unsafe fn splat_i32(v: i32) -> Self::I;
    unsafe fn splat(v: f32) -> Self::F;
    /// `4 · ROWS` bytes from `p`.
    unsafe fn load(p: *const u8) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    /// The 16 bytes of `t` in every 128-bit lane, for [`Width::lookup`].
    unsafe fn table(t: &[u8; 16]) -> Self::I;
    /// Each byte of `v` (0-15) replaced by that byte of its lane's `table` (`pshufb`).
    unsafe fn lookup(table: Self::I, v: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    /// 16-bit lanes shifted left by `N` (1-4).
    unsafe fn shl16<const N: i32>(v: Self::I) -> Self::I;
    /// 16-bit lanes shifted right by `N` (1-4).
    unsafe fn shr16<const N: i32>(v: Self::I) -> Self::I;
    /// 32-bit lanes shifted left by `N` (2, 4, 6 or 16).
    unsafe fn shl32<const N: i32>(v: Self::I) -> Self::I;
    /// 32-bit lanes shifted right by `N` (2, 4 or 6).
    unsafe fn shr32<const N: i32>(v: Self::I) -> Self::I;
    unsafe fn cvt(v: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `-a`, by its sign bit (exact).
    unsafe fn neg(a: Self::F) -> Self::F;
    /// `a · b + c`.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `ROWS` f16 scales from `p`.
    unsafe fn scales(p: *const f16) -> Self::F;
    /// `ROWS` bytes from `p` as i8, converted.
    unsafe fn bytes_i8(p: *const u8) -> Self::F;
    /// `ROWS` bytes from `p` as u8, one per 32-bit lane.
    unsafe fn bytes_u32(p: *const u8) -> Self::I;
    /// `ROWS` bytes from `p` as i8, one per 32-bit lane (sign-extended).
    unsafe fn bytes_i32(p: *const u8) -> Self::I;
    /// `init + Σ_n v[n] · quad n of y`, exact, per 32-bit lane: `v` unsigned bytes, the `N`
    /// quads from `y` (`4 N` readable bytes) signed and each broadcast to every lane. `CHUNK`
    /// is how many products the operands' range lets a 16-bit sum take before widening,
    /// where a width sums in 16 bits. (A format's integer offset goes in as `init`: one
    /// broadcast instead of zeroing the sum and subtracting afterwards.)
    unsafe fn quad_dot<const N: usize, const CHUNK: usize>(
        init: Self::I,
        v: &[Self::I; N],
        y: *const i8,
    ) -> Self::I;
    /// `a + b` per 32-bit lane.
    unsafe fn add32(a: Self::I, b: Self::I) -> Self::I;
    /// `a · b` per 32-bit lane, the low 32 bits (`vpmulld`).
    unsafe fn mul32(a: Self::I, b: Self::I) -> Self::I;
    /// Per 32-bit lane, the low 16 bits of `lo`'s lane below those of `hi`'s: the pair
    /// that [`Width::madd16`] multiplies by another.
    unsafe fn pack16(lo: Self::I, hi: Self::I) -> Self::I;
    /// `vpmaddwd`: per 32-bit lane, the sum of its two 16-bit products of `a` and `b`.
    unsafe fn madd16(a: Self::I, b: Self::I) -> Self::I;
    /// Per-lane integer scales `sc` (-128 to 127, one per 32-bit lane) in the form
    /// [`Width::quad_dot_scaled`] takes.
    unsafe fn scale_operand(sc: Self::I) -> Self::I;
    /// `acc + sc · Σ_n v[n] · quad n of y` per 32-bit lane, exact: [`Width::quad_dot`]
    /// (zero `init`) times the lane's scale, `sc` from [`Width::scale_operand`]. Where a
    /// width sums in 16 bits the scale widens them (`vpmaddwd` by the scale instead of by
    /// ones), so it costs nothing there.
    unsafe fn quad_dot_scaled<const N: usize, const CHUNK: usize>(
        acc: Self::I,
        sc: Self::I,
        v: &[Self::I; N],
        y: *const i8,
    ) -> Self::I;
    /// [`Width::quad_dot_scaled`] of `R` activation rows against the same quants, `y[r]`
    /// row `r`'s quads (`4 N` readable bytes each).
    #[inline(always)]
    unsafe fn quad_dot_scaled_rows<const R: usize, const N: usize, const CHUNK: usize>(
        acc: &mut [Self::I; R],
        sc: Self::I,
        v: &[Self::I; N],
        y: &[*const i8; R],
    ) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { each_row_scaled::<R, N, CHUNK, Self>(acc, sc, v, y) }
    }
    unsafe fn store(v: Self::F) -> Self::Out;
    /// The Q8_0 tile of `U` units: [`tile_units`]'s contract.
    unsafe fn tile_q8_0<const R: usize, const U: usize>(
        w: &QuantMatrix,
        u: usize,
        x: &Q8Rows,
        i: usize,
    ) -> [[Self::Out; R]; U];
}

/// [`Width::quad_dot_scaled_rows`] one row at a time: the default, and what a width's own
/// version falls back to for the operands it has no better way for.
///
/// # Safety
/// [`Width::quad_dot_scaled_rows`]'s contract.
#[inline(always)]
pub(super) unsafe fn each_row_scaled<
    const R: usize,
    const N: usize,
    const CHUNK: usize,
    W: Width + ?Sized,
>(
    acc: &mut [W::I; R],
    sc: W::I,
    v: &[W::I; N],
    y: &[*const i8; R],
) {
    for_each_row!(R, r, {
        // SAFETY: the caller's contract, forwarded.
        acc[r] = unsafe { W::quad_dot_scaled::<N, CHUNK>(acc[r], sc, v, y[r]) };
    });
}

/// `out[r][c] = w[u·W::ROWS + c] · x[i + r]`: the tile of `w`'s format.
///
/// # Safety
/// The CPU must have what `W` needs; `w` must have rows `u·W::ROWS..(u + 1)·W::ROWS`
/// (padding included), and rows `i..i + R` of `x` must exist, with the same number of
/// blocks.
#[inline(always)]
pub(super) unsafe fn tile<const R: usize, W: Width>(
    w: &QuantMatrix,
    u: usize,
    x: &Q8Rows,
    i: usize,
) -> [W::Out; R] {
    // SAFETY: the caller's contract, forwarded.
    let [out] = unsafe { tile_units::<R, 1, W>(w, u, x, i) };
    out
}

/// `out[k][r][c] = w[(u + k)·W::ROWS + c] · x[i + r]`: `U` consecutive units of one group
/// in one pass over its blocks. A 256-bit unit is half a group, whose quants fill half of
/// each 64-byte line: the halves one after another read a group's memory on the first and
/// find it cached on the second, so one-row decoding left memory idle for half its time
/// (the other half computing from cache). Both halves per block stream each line once, and
/// share the activations' loads.
///
/// # Safety
/// [`tile`]'s contract for each unit `u..u + U`, all in one group.
#[inline(always)]
pub(super) unsafe fn tile_units<const R: usize, const U: usize, W: Width>(
    w: &QuantMatrix,
    u: usize,
    x: &Q8Rows,
    i: usize,
) -> [[W::Out; R]; U] {
    debug_assert!(u * W::ROWS / GROUP == (u + U - 1) * W::ROWS / GROUP);
    // SAFETY: (each arm) the caller's contract, forwarded.
    unsafe {
        match w.ty {
            GgmlType::Q4_0 => tile_nibbles::<R, U, W, formats::Q4_0>(w, u, x, i),
            GgmlType::Q4_1 => tile_nibbles::<R, U, W, formats::Q4_1>(w, u, x, i),
            GgmlType::Q5_0 => tile_nibbles::<R, U, W, formats::Q5_0>(w, u, x, i),
            GgmlType::Q5_1 => tile_nibbles::<R, U, W, formats::Q5_1>(w, u, x, i),
            GgmlType::Q4_K if w.block_activations => {
                tile_nibbles::<R, U, W, formats::Q4_K>(w, u, x, i)
            }
            GgmlType::Q5_K if w.block_activations => {
                tile_nibbles::<R, U, W, formats::Q5_K>(w, u, x, i)
            }
            GgmlType::Q4_K => tile_nibbles::<R, U, W, formats::Q4_K_Shared>(w, u, x, i),
            GgmlType::Q5_K => tile_nibbles::<R, U, W, formats::Q5_K_Shared>(w, u, x, i),
            GgmlType::Q6_K if w.block_activations => {
                tile_nibbles::<R, U, W, formats::Q6_K>(w, u, x, i)
            }
            GgmlType::Q6_K => tile_nibbles::<R, U, W, formats::Q6_K_Shared>(w, u, x, i),
            GgmlType::MXFP4 => tile_nibbles::<R, U, W, formats::MXFP4>(w, u, x, i),
            _ => W::tile_q8_0::<R, U>(w, u, x, i),
        }
    }
}

/// [`tile`] for the formats stored as nibbles: 4-, 5- and 6-bit, plain and K-quants. A
/// block's four quant vectors give eight nibble vectors (low nibbles: values `4j..4j + 4` of
/// each row, high nibbles: `16 + 4j..`), with the bits above the nibbles or-ed in from
/// `hbits` ([`merge_high_bits`]); the scales apply as [`block_scales`] says. Q6_K's halves
/// of 16 have their own scales, so their sums stay apart, and its `-32` offset is taken off
/// each half's integer sum as 32 times the activations' sum over the half: exact, where an
/// offset in floats would cancel most of the sum's bits. Where a width sums products in 16
/// bits, 4-bit products fit all eight together (8 · 2 · 15 · 127 = 30,480); wider quants
/// overflow sooner, so their sums are widened every 4 (5 bits: 4 · 2 · 31 · 127 = 31,496)
/// or 2 (6 bits: 2 · 2 · 63 · 127 = 32,004) products.
// Index loops: the nibble index selects a register and a shift; `r` an accumulator and a row.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn tile_nibbles<const R: usize, const U: usize, W: Width, F: QuantFormat>(
    w: &QuantMatrix,
    u: usize,
    x: &Q8Rows,
    i: usize,
) -> [[W::Out; R]; U] {
    const { assert!(4 <= F::BITS && F::BITS <= 6 && GROUP.is_multiple_of(W::ROWS)) };
    debug_assert_eq!(w.ty, F::TYPE);
    let nb = w.nb;
    let block_bytes = GROUP * QK / 2;
    let hb = hbits_bytes(w.ty);
    // Group g, and the first unit's first row within it (0 for a whole group); unit k's
    // bytes and scales lie k·W::ROWS lanes further in each vector.
    let (g, h) = (u * W::ROWS / GROUP, u * W::ROWS % GROUP);
    let wq = w.qs.as_ptr().wrapping_add(g * nb * block_bytes + h * 4);
    let sub_step = sub_bytes(w.ty);
    let wsub = w.sub.as_ptr().wrapping_add(g * nb * sub_step + h);
    let wh = w.hbits.as_ptr().wrapping_add(g * nb * hb + h * 4);
    let scales_per_group = if F::KQUANT { nb / KSUB } else { nb };
    let at = g * scales_per_group * GROUP + h;
    let wd = w.d.as_ptr().wrapping_add(at);
    let wm = w.mins.as_ptr().wrapping_add(at);
    let wmh = w.mins_hi.as_ptr().wrapping_add(at * 4);
    let x = XRows::<R>::new(x, i, nb);
    // SAFETY: (whole body) group g holds nb blocks of `block_bytes` quants and `hb`
    // high-bit bytes, `scales_per_group` scales (and minima, for Q4_1, Q5_1, Q4_K and Q5_K)
    // of GROUP rows each, and `sub_step` scale bytes per block for K-quants (and a u32 of
    // minima's top bits per row and super-block for Q4_K and Q5_K); the units' rows
    // h..h + U·W::ROWS lie within the group; activation rows i..i + R hold nb blocks of QK
    // quants, scales, sums and half sums. The rest is register arithmetic under `W`'s
    // features, which the caller's contract provides.
    unsafe {
        let lut = W::table(&F::LUT.unwrap_or([0; 16]));
        let mut acc = [[W::zero_f(); R]; U];
        // K-quants with shared activation scales: a super-block's sub-block sums times
        // their integer scales, exact (`activations::shared_blocks`).
        let mut iacc = [[W::zero_i(); R]; U];
        let mut dsup = [W::zero_f(); U];
        let mut msup = [W::zero_f(); U];
        let mut mins_hi = [W::zero_i(); U];
        for b in 0..nb {
            let q = wq.add(b * block_bytes);
            prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
            // The bits above the nibbles are a second stream, as far ahead in blocks.
            prefetch_block(wh.wrapping_add((b + GROUP_PREFETCH / block_bytes) * hb), hb);
            for_each_row!(U, k, {
                let lane = k * W::ROWS;
                if F::SCALES != Scales::SubMinShared && (!F::KQUANT || b % KSUB == 0) {
                    let at = if F::KQUANT { b / KSUB } else { b } * GROUP + lane;
                    dsup[k] = W::scales(wd.add(at));
                    if F::MINS {
                        msup[k] = W::scales(wm.add(at));
                    }
                    if F::SCALES == Scales::SubMin {
                        mins_hi[k] = W::load(wmh.add(at * 4));
                    }
                }
                let mut v =
                    unpack_block::<W, F>(q.add(lane * 4), wh.wrapping_add(b * hb + lane * 4));
                if F::LUT.is_some() {
                    for n in &mut v {
                        *n = W::lookup(lut, *n);
                    }
                }
                if F::SCALES == Scales::SubMinShared {
                    let packed = W::bytes_u32(wsub.wrapping_add(b * sub_step + lane));
                    let sc = W::scale_operand(W::and(packed, W::splat_i32(0x3F)));
                    let y: [*const i8; R] = std::array::from_fn(|r| x.qs[r].wrapping_add(b * QK));
                    if F::BITS == 5 {
                        W::quad_dot_scaled_rows::<R, 8, 4>(&mut iacc[k], sc, &v, &y);
                    } else {
                        W::quad_dot_scaled_rows::<R, 8, 8>(&mut iacc[k], sc, &v, &y);
                    }
                    if b % KSUB == KSUB - 1 {
                        let sb = b / KSUB;
                        let at = sb * GROUP + lane;
                        flush_super_block::<R, W>(
                            &mut acc[k],
                            &mut iacc[k],
                            [W::scales(wd.add(at)), W::scales(wm.add(at))],
                            wsub.wrapping_add(sb * KSUB * sub_step + lane),
                            sub_step,
                            W::load(wmh.add(at * 4)),
                            &x,
                            sb * KSUB,
                        );
                    }
                } else if F::SCALES == Scales::SubSignedShared {
                    // Each half's integer sum times its scale, and its -32 as the scale
                    // times -32 times the activations' half sum (`vpmaddwd` of the pairs).
                    let sub = wsub.wrapping_add(b * sub_step + lane);
                    let (slo, shi) = (W::bytes_i32(sub), W::bytes_i32(sub.add(GROUP)));
                    let neg32 = W::splat_i32(-32);
                    let offset = W::pack16(W::mul32(slo, neg32), W::mul32(shi, neg32));
                    let (sclo, schi) = (W::scale_operand(slo), W::scale_operand(shi));
                    let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
                    let sums = &mut iacc[k];
                    for_each_row!(R, r, {
                        let y = x.qs[r].add(b * QK);
                        let half = (x.half_sums[r].add(b) as *const i32).read_unaligned();
                        let s = W::add32(sums[r], W::madd16(offset, W::splat_i32(half)));
                        let s = W::quad_dot_scaled::<4, 2>(s, sclo, &[v0, v1, v2, v3], y);
                        sums[r] =
                            W::quad_dot_scaled::<4, 2>(s, schi, &[v4, v5, v6, v7], y.add(QK / 2));
                    });
                    if b % KSUB == KSUB - 1 {
                        let b0 = b + 1 - KSUB;
                        let acc = &mut acc[k];
                        for_each_row!(R, r, {
                            let dx = W::mul(dsup[k], W::splat(*x.d[r].add(b0)));
                            acc[r] = W::fmadd(W::cvt(sums[r]), dx, acc[r]);
                            sums[r] = W::zero_i();
                        });
                    }
                } else {
                    let (dlo, dhi, mlo) = block_scales::<W, F>(
                        dsup[k],
                        msup[k],
                        wsub.wrapping_add(b * sub_step + lane),
                        mins_hi[k],
                    );
                    if F::SCALES == Scales::SubMin {
                        mins_hi[k] = W::shr32::<4>(mins_hi[k]);
                    }
                    let acc = &mut acc[k];
                    for_each_row!(R, r, {
                        let y = x.qs[r].add(b * QK);
                        let dx = W::splat(*x.d[r].add(b));
                        if F::SCALES == Scales::SubSigned {
                            let [v0, v1, v2, v3, v4, v5, v6, v7] = v;
                            let [olo, ohi] = *x.offsets[r].add(b);
                            let lo = W::quad_dot::<4, 2>(W::splat_i32(olo), &[v0, v1, v2, v3], y);
                            let hi = W::quad_dot::<4, 2>(
                                W::splat_i32(ohi),
                                &[v4, v5, v6, v7],
                                y.add(QK / 2),
                            );
                            acc[r] = W::fmadd(W::cvt(lo), W::mul(dlo, dx), acc[r]);
                            acc[r] = W::fmadd(W::cvt(hi), W::mul(dhi, dx), acc[r]);
                        } else {
                            // MXFP4's looked-up quants reach 24: 5-bit range.
                            let isum = if F::BITS == 5 || F::LUT.is_some() {
                                W::quad_dot::<8, 4>(W::zero_i(), &v, y)
                            } else {
                                W::quad_dot::<8, 8>(W::zero_i(), &v, y)
                            };
                            acc[r] = W::fmadd(W::cvt(isum), W::mul(dlo, dx), acc[r]);
                            acc[r] = W::fmadd(mlo, W::splat(*x.s[r].add(b)), acc[r]);
                        }
                    });
                }
            });
        }
        let mut out = [[W::Out::default(); R]; U];
        for (o, a) in out.iter_mut().zip(acc) {
            *o = store_rows::<R, W>(a);
        }
        out
    }
}

/// A tile's rows of results. A loop, not `array::map`: a closure gets none of the entry
/// point's target features, and the 512-bit tiles of 5 to 8 rows called `map` out of line.
#[inline(always)]
pub(super) unsafe fn store_rows<const R: usize, W: Width>(acc: [W::F; R]) -> [W::Out; R] {
    let mut out = [W::Out::default(); R];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: the caller has W's target features.
        *o = unsafe { W::store(a) };
    }
    out
}

/// The end of a Q4_K or Q5_K super-block (blocks `b0..b0 + KSUB`) for one unit of weight
/// rows: `acc[r] += dx · (d · I[r] - dmin · Σ_t m_t · Σ q_t)`, `I` the super-block's
/// scaled integer sums (`iacc`, cleared for the next), `m_t` block `t`'s 6-bit minimum and
/// `Σ q_t` the activations' block sum, summed exactly by `vpmaddwd` two blocks at a time.
/// `ds` holds the unit's `d` and `dmin`; `sub` points to block `b0`'s [`sub_bytes`] (each
/// block `sub_step` further), whose top two bits are the minima's low bits, and
/// `mins_hi` the minima's top nibbles (block `t`'s at bits `4t..4t + 4`).
///
/// # Safety
/// The sub-block bytes are readable; activation rows of `x` hold block `b0 + KSUB - 1`;
/// the CPU has `W`'s features.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn flush_super_block<const R: usize, W: Width>(
    acc: &mut [W::F; R],
    iacc: &mut [W::I; R],
    ds: [W::F; 2],
    sub: *const u8,
    sub_step: usize,
    mins_hi: W::I,
    x: &XRows<R>,
    b0: usize,
) {
    // SAFETY: (whole body) the caller's contract; the rest is register arithmetic.
    unsafe {
        let neg_dmin = W::neg(ds[1]);
        let mut top = mins_hi;
        let mut pairs = [W::zero_i(); KSUB / 2];
        for t in 0..KSUB {
            let packed = W::bytes_u32(sub.add(t * sub_step));
            let high = W::and(W::shl32::<2>(top), W::splat_i32(0x3C));
            let m = W::or(W::shr32::<6>(packed), high);
            top = W::shr32::<4>(top);
            pairs[t / 2] = if t % 2 == 0 {
                m
            } else {
                W::or(pairs[t / 2], W::shl32::<16>(m))
            };
        }
        for_each_row!(R, r, {
            let q = x.qsum[r].add(b0) as *const i32;
            let mut mins = W::madd16(pairs[0], W::splat_i32(q.read_unaligned()));
            for (p, &m) in pairs.iter().enumerate().skip(1) {
                mins = W::add32(mins, W::madd16(m, W::splat_i32(q.add(p).read_unaligned())));
            }
            let dx = W::splat(*x.d[r].add(b0));
            let sum = W::fmadd(W::cvt(mins), neg_dmin, W::mul(W::cvt(iacc[r]), ds[0]));
            acc[r] = W::fmadd(sum, dx, acc[r]);
            iacc[r] = W::zero_i();
        });
    }
}

/// A block's eight nibble vectors of one unit ([`tile_nibbles`] says which values each
/// holds): the low and high nibbles of its four quant vectors from `q`, with the bits above
/// them or-ed in from the high-bit planes at `h` ([`merge_high_bits`]).
///
/// # Safety
/// `q` must point to the unit's lanes of the block's first quant vector (the others follow
/// [`VEC_BYTES`] apart) and `h` likewise into its planes (none for 4-bit formats); the CPU
/// has `W`'s features.
#[inline(always)]
pub(super) unsafe fn unpack_block<W: Width, F: QuantFormat>(
    q: *const u8,
    h: *const u8,
) -> [W::I; 8] {
    // SAFETY: (whole body) the vectors and planes are readable by the contract; the rest
    // is register arithmetic.
    unsafe {
        let low = W::splat_i8(0x0F);
        let mut v = [W::zero_i(); 8];
        for j in 0..4 {
            let raw = W::load(q.add(j * VEC_BYTES));
            v[j] = W::and(raw, low);
            v[4 + j] = W::and(W::shr16::<4>(raw), low);
        }
        merge_high_bits::<W, F>(&mut v, h);
        v
    }
}

/// Ors the bits above the nibbles into a block's eight nibble vectors, from its high-bit
/// planes at `h` (see [`hbits_bytes`]): for 5-bit formats, bit `n` of each plane byte
/// becomes bit 4 of nibble vector `n`; for Q6_K, plane `p`'s bits `2n..2n + 2` become bits
/// 4-5 of vector `4p + n`. A 16-bit shift moves no bit across a byte boundary into those
/// bits for these distances.
///
/// # Safety
/// `h` must point to the block's planes (none for 4-bit formats); the CPU has `W`'s
/// features.
#[inline(always)]
unsafe fn merge_high_bits<W: Width, F: QuantFormat>(v: &mut [W::I; 8], h: *const u8) {
    // SAFETY: (whole body) the planes are readable by the contract; the rest is register
    // arithmetic.
    unsafe {
        if F::BITS == 5 {
            let h = W::load(h);
            let bit = W::splat_i8(0x10);
            let or = |v: W::I, h: W::I| W::or(v, W::and(h, bit));
            v[0] = or(v[0], W::shl16::<4>(h));
            v[1] = or(v[1], W::shl16::<3>(h));
            v[2] = or(v[2], W::shl16::<2>(h));
            v[3] = or(v[3], W::shl16::<1>(h));
            v[4] = or(v[4], h);
            v[5] = or(v[5], W::shr16::<1>(h));
            v[6] = or(v[6], W::shr16::<2>(h));
            v[7] = or(v[7], W::shr16::<3>(h));
        }
        if F::BITS == 6 {
            let top = W::splat_i8(0x30);
            let or = |v: W::I, h: W::I| W::or(v, W::and(h, top));
            for p in 0..2 {
                let h = W::load(h.add(VEC_BYTES * p));
                v[4 * p] = or(v[4 * p], W::shl16::<4>(h));
                v[4 * p + 1] = or(v[4 * p + 1], W::shl16::<2>(h));
                v[4 * p + 2] = or(v[4 * p + 2], h);
                v[4 * p + 3] = or(v[4 * p + 3], W::shr16::<2>(h));
            }
        }
    }
}

/// A block's `(dlo, dhi, mlo)`: the scales of its integer sums over values 0..16 and
/// 16..32 (equal but for Q6_K), and the factor of the activations' block sum that applies
/// the format's offset (Q4_0 and Q5_0's -8 and -16, Q4_1 and Q5_1's stored minima, the
/// K-quants' `-dmin·m`). K-quants' scales `d·sc` are made per block from the super-block's
/// `d` (`dsup`, and `dmin` in `msup`) and the 6- or 8-bit `sc` of the unit's rows at `sub`;
/// Q4_K's and Q5_K's minima from the two bits above `sc` and the low nibble of each lane of
/// `mins_hi` (the block's top bits: see `QuantMatrix::mins_hi`). (With shared activation
/// scales, the K-quants take theirs per super-block: Q4_K's and Q5_K's in
/// [`flush_super_block`], Q6_K's in [`tile_nibbles`].)
///
/// # Safety
/// For K-quants, `sub` must point to the block's [`sub_bytes`] (less the unit's offset);
/// the CPU has `W`'s features.
#[inline(always)]
unsafe fn block_scales<W: Width, F: QuantFormat>(
    dsup: W::F,
    msup: W::F,
    sub: *const u8,
    mins_hi: W::I,
) -> (W::F, W::F, W::F) {
    // SAFETY: (whole body) the sub-block scales are readable by the contract; the rest is
    // register arithmetic.
    unsafe {
        match F::SCALES {
            Scales::Offset(offset) => (dsup, dsup, W::mul(dsup, W::splat(offset))),
            Scales::Min => (dsup, dsup, msup),
            Scales::SubSigned => {
                let dlo = W::mul(dsup, W::bytes_i8(sub));
                let dhi = W::mul(dsup, W::bytes_i8(sub.add(GROUP)));
                (dlo, dhi, W::zero_f())
            }
            Scales::SubMin => {
                let packed = W::bytes_u32(sub);
                let sc = W::and(packed, W::splat_i32(0x3F));
                let top = W::and(W::shl32::<2>(mins_hi), W::splat_i32(0x3C));
                let m = W::or(W::shr32::<6>(packed), top);
                let d = W::mul(dsup, W::cvt(sc));
                let m = W::mul(msup, W::cvt(m));
                (d, d, W::neg(m))
            }
            Scales::SubMinShared | Scales::SubSignedShared => {
                unreachable!("shared activation scales: per super-block")
            }
        }
    }
}

/// Where activation rows `i..i + R` of a [`Q8Rows`] (`nb` blocks each) start: their quants,
/// scales, sums and half sums. Made with `wrapping_add`, so making them is safe; the
/// kernels that read through them state why the rows exist.
pub(super) struct XRows<const R: usize> {
    pub(super) qs: [*const i8; R],
    pub(super) d: [*const f32; R],
    pub(super) s: [*const f32; R],
    pub(super) offsets: [*const [i32; 2]; R],
    pub(super) qsum: [*const i16; R],
    pub(super) half_sums: [*const [i16; 2]; R],
}

impl<const R: usize> XRows<R> {
    #[inline(always)]
    pub(super) fn new(x: &Q8Rows, i: usize, nb: usize) -> Self {
        XRows {
            qs: std::array::from_fn(|r| x.qs.as_ptr().wrapping_add((i + r) * nb * QK)),
            d: std::array::from_fn(|r| x.d.as_ptr().wrapping_add((i + r) * nb)),
            s: std::array::from_fn(|r| x.s.as_ptr().wrapping_add((i + r) * nb)),
            offsets: std::array::from_fn(|r| x.offsets.as_ptr().wrapping_add((i + r) * nb)),
            qsum: std::array::from_fn(|r| x.qsum.as_ptr().wrapping_add((i + r) * nb)),
            half_sums: std::array::from_fn(|r| x.half_sums.as_ptr().wrapping_add((i + r) * nb)),
        }
    }
}

/// Asks for the `bytes` (a multiple of 64) from `p` on, one cache line at a time.
#[inline(always)]
pub(super) fn prefetch_block(p: *const u8, bytes: usize) {
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address; SSE is
        // part of x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8) };
    }
}

/// How far ahead of the current block a Q8_0 group's quants are prefetched, in bytes (4
/// blocks).
pub(super) const Q8_0_PREFETCH: usize = 4 * GROUP * QK;

/// How far ahead of the current block a group's quants are prefetched, in bytes (8 blocks).
/// Every cache line of a block is asked for: one prefetch per block of two lines measured
/// 25-40 % slower one-sequence decode on an AVX2 EPYC (the hardware prefetcher alone does
/// not keep enough loads in flight, most of all on one thread); twice as far ahead was no
/// better.
pub(super) const GROUP_PREFETCH: usize = 8 * GROUP * QK / 2;
