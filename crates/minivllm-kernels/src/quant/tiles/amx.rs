//! AMX-INT8 tiles: 16 or 32 activation rows against a whole group of weight rows, for
//! prefills and batched steps.
//!
//! The groups layout is already the one AMX wants for its second operand: a quant vector
//! holds four consecutive values of each of sixteen weight rows, which is one row of a B
//! tile. So per block of 32, the group's quants are unpacked as the 512-bit tiles unpack
//! them (nibbles, the bits above, MXFP4's table) into eight such rows (Q8_0's bytes are
//! read as they lie), the activation rows' quants are an A tile straight from [`Q8Rows`]
//! (16 rows of 32 bytes), and one `tdpbsud` gives the block's exact integer sums for 16
//! activation rows × 16 weight rows. Those sums then take the 512-bit tiles' float steps
//! in the same order, so every output is theirs to the bit, whatever tile computed it:
//! only the integer products moved, to a unit that does eight times the multiply-adds of
//! a `vpdpbusd` per instruction. (Summing several blocks in the tile before scaling would
//! be faster still, but every block has its own scales.)

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use half::f16;

use super::avx512::Zmm;
use super::{
    block_scales, merge_high_bits, prefetch_block, store_rows, Width, GROUP_PREFETCH, Q8_0_PREFETCH,
};
use crate::amx::{self, TileConfig};
use crate::quant::activations::Q8Rows;
use crate::quant::formats::{self, GgmlType, QuantFormat, Scales, QK};
use crate::quant::layout::{hbits_bytes, sub_bytes, QuantMatrix, GROUP, KSUB, VEC_BYTES};

/// Activation rows per A tile.
pub(in crate::quant) const TILE_ROWS: usize = 16;

/// Tile registers: sums in 0-3 (16 rows of 16 lanes, one lane per weight row: blocks in
/// flight alternate between 0-1 and 2-3), activations in 4-5, weights in 6-7. The part every format
/// shares.
const SUMS: TileConfig = TileConfig::new()
    .tile(0, 16, 64)
    .tile(1, 16, 64)
    .tile(2, 16, 64)
    .tile(3, 16, 64);

/// A block's activations as 16 rows of 32 bytes, its weights as 8 rows of 64 bytes (a quad
/// of each weight row per row); two blocks' worth of each.
const WHOLE: TileConfig = SUMS
    .tile(4, 16, 32)
    .tile(5, 16, 32)
    .tile(6, 8, 64)
    .tile(7, 8, 64);

/// Q6_K's halves of 16 values have their own scales, so their sums stay apart: A tiles of
/// 16 bytes (a half), B tiles of 4 rows, and a sums tile per half (0-1 for one block, 2-3
/// for the next).
const HALVES: TileConfig = SUMS
    .tile(4, 16, 16)
    .tile(5, 16, 16)
    .tile(6, 4, 64)
    .tile(7, 4, 64);

/// Bytes of one stored sums tile: 16 rows of 16 i32.
const SUMS_TILE: usize = TILE_ROWS * 64;

/// Two blocks' stored sums tiles (`[block parity][tile][row][lane]`), left uninitialised:
/// every byte is written by a tile store before it is read, and zeroing the scratch of each
/// tile measured a tenth of a batched step.
#[repr(C, align(64))]
struct Sums([[u8; 2 * SUMS_TILE]; 2]);

impl Sums {
    /// Block parity `n`'s two tiles, as a pointer into `s`.
    fn part(s: &mut MaybeUninit<Sums>, n: usize) -> *mut u8 {
        let p = s.as_mut_ptr();
        // SAFETY: in bounds of `s` (n < 2); no reference to uninitialised bytes is made.
        unsafe { (&raw mut (*p).0[n]) as *mut u8 }
    }
}

/// One cache line of unpacked weights.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A group's weights as B tiles, unpacked once for every activation tile that meets them:
/// eight rows of 64 bytes per block. (Unpacking each block just before its tile load made
/// the tile load wait for the vector stores to reach the cache, which cost more than the
/// products.)
#[derive(Default)]
pub(in crate::quant) struct GroupTiles {
    lines: Vec<Line>,
}

impl GroupTiles {
    /// Group `g` of `w` as B tiles: unpacked into this buffer, or Q8_0's bytes where they
    /// lie. The pointer is valid while `w` and this buffer are neither dropped nor unpacked
    /// into again.
    ///
    /// # Safety
    /// The CPU must have AVX512-F and -BW; `w` must have group `g`.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
    pub(in crate::quant) unsafe fn unpack(&mut self, w: &QuantMatrix, g: usize) -> *const u8 {
        let nb = w.nb;
        if w.ty == GgmlType::Q8_0 {
            return w.qs.as_ptr().wrapping_add(g * nb * GROUP * QK);
        }
        let lines = nb * 8;
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([0; 64]));
        }
        let hb = hbits_bytes(w.ty);
        let p = GroupPtrs {
            q: w.qs.as_ptr().wrapping_add(g * nb * GROUP * QK / 2),
            h: w.hbits.as_ptr().wrapping_add(g * nb * hb),
            hb,
        };
        let out = self.lines.as_mut_ptr() as *mut u8;
        // SAFETY: (each arm) group g holds nb blocks of quants and high bits; `out` holds
        // nb · 512 aligned bytes; the CPU features are this function's.
        unsafe {
            macro_rules! each {
                ($f:ty) => {
                    for b in 0..nb {
                        unpack::<$f>(&p, b, out.add(b * 8 * VEC_BYTES));
                    }
                };
            }
            match w.ty {
                GgmlType::Q4_0 => each!(formats::Q4_0),
                GgmlType::Q4_1 => each!(formats::Q4_1),
                GgmlType::Q5_0 => each!(formats::Q5_0),
                GgmlType::Q5_1 => each!(formats::Q5_1),
                GgmlType::Q4_K => each!(formats::Q4_K),
                GgmlType::Q5_K => each!(formats::Q5_K),
                GgmlType::Q6_K => each!(formats::Q6_K),
                GgmlType::MXFP4 => each!(formats::MXFP4),
                ty => unreachable!("no groups layout for {ty}"),
            }
        }
        out
    }
}

/// The tile shapes of one product, loaded by [`Tiles::new`] and released when dropped:
/// loading them costs about as much as a block's products, so a run of tiles over one
/// matrix loads them once.
pub(in crate::quant) struct Tiles {
    ty: GgmlType,
}

impl Tiles {
    /// Configures the tile registers for weights of `ty`.
    ///
    /// # Safety
    /// [`amx::available`] must be true. No other tile user may run on this thread until
    /// the value is dropped.
    #[inline]
    pub(in crate::quant) unsafe fn new(ty: GgmlType) -> Tiles {
        // SAFETY: the caller's contract.
        unsafe {
            amx::configure(if ty == GgmlType::Q6_K {
                &HALVES
            } else {
                &WHOLE
            })
        };
        Tiles { ty }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: `new` found AMX available.
        unsafe { amx::release() };
    }
}

/// Whether the AMX tiles run products with `w`: not K-quants against activations
/// with one scale per super-block (`activations::shared_blocks`), whose 512-bit tiles sum a
/// super-block's scaled sub-block sums in integers ([`super::tile_nibbles`]); these tiles
/// apply each block's scales in floats, and AMX measured no faster than AVX512-VNNI anyway
/// (it is opt-in).
pub(in crate::quant) fn takes(w: &QuantMatrix) -> bool {
    crate::quant::activations::shared_blocks(w) == 1
}

/// `out[r][c] = w[g·GROUP + c] · x[i + r]` for 16 activation rows: the 512-bit tile's
/// results ([`super::tile`]), bit for bit. (Tiles of 32 rows measured no faster: their
/// 32 accumulators do not fit in registers.)
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C, AVX512-F, -BW and -VNNI (as AMX CPUs all do); `w`
/// must have group `g`, `bq` must be what [`GroupTiles::unpack`] gave for it, and rows
/// `i..i + 16` of `x` must exist, with the same number of blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(in crate::quant) unsafe fn tile_group(
    tiles: &Tiles,
    w: &QuantMatrix,
    g: usize,
    bq: *const u8,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; TILE_ROWS] {
    assert_eq!(tiles.ty, w.ty, "AMX tiles configured for another format");
    assert!(
        takes(w),
        "AMX tiles do not take {} with shared activation scales",
        w.ty
    );
    // SAFETY: (each arm) the caller's contract, forwarded; `tiles` has the tile registers
    // configured for this format.
    unsafe {
        match w.ty {
            GgmlType::Q4_0 => tile_nibbles::<formats::Q4_0>(w, g, bq, x, i),
            GgmlType::Q4_1 => tile_nibbles::<formats::Q4_1>(w, g, bq, x, i),
            GgmlType::Q5_0 => tile_nibbles::<formats::Q5_0>(w, g, bq, x, i),
            GgmlType::Q5_1 => tile_nibbles::<formats::Q5_1>(w, g, bq, x, i),
            GgmlType::Q4_K => tile_nibbles::<formats::Q4_K>(w, g, bq, x, i),
            GgmlType::Q5_K => tile_nibbles::<formats::Q5_K>(w, g, bq, x, i),
            GgmlType::Q6_K => tile_nibbles::<formats::Q6_K>(w, g, bq, x, i),
            GgmlType::MXFP4 => tile_nibbles::<formats::MXFP4>(w, g, bq, x, i),
            _ => tile_q8_0(w, g, bq, x, i),
        }
    }
}

/// Issues a block's products for 16 activation rows (A tiles from `y`, rows `ldx` bytes
/// apart) against its weights (B tiles from the 8 rows of 64 bytes at `b`): whole blocks
/// into sums tile `C0` (A tile `A`, B tile `B`); or (`HALVES`, Q6_K) the first 16 values'
/// sums into `C0` and the last 16's into `C1`, from A tiles 4 and 5 of 16 bytes and B
/// tiles 6 and 7 of four rows. `SIGNED`: B holds signed bytes (Q8_0). Nothing is stored:
/// [`retire`] does that a block later, when the products are done, so that neither unit
/// waits for the other.
///
/// # Safety
/// The configuration for `HALVES` must be loaded; `y` must have 16 rows `ldx` apart of 32
/// readable bytes, `b` 512.
#[inline(always)]
unsafe fn issue<
    const HALVES: bool,
    const SIGNED: bool,
    const C0: u8,
    const C1: u8,
    const A: u8,
    const B: u8,
>(
    b: *const u8,
    y: *const u8,
    ldx: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        if HALVES {
            amx::load::<6>(b, VEC_BYTES);
            amx::load::<7>(b.add(4 * VEC_BYTES), VEC_BYTES);
            amx::zero::<C0>();
            amx::zero::<C1>();
            amx::load::<4>(y, ldx);
            amx::load::<5>(y.add(QK / 2), ldx);
            amx::dot_su::<C0, 4, 6>();
            amx::dot_su::<C1, 5, 7>();
            return;
        }
        amx::load::<B>(b, VEC_BYTES);
        amx::zero::<C0>();
        amx::load::<A>(y, ldx);
        if SIGNED {
            amx::dot_ss::<C0, A, B>();
        } else {
            amx::dot_su::<C0, A, B>();
        }
    }
}

/// Stores the sums tiles [`issue`] filled: `C0` at `base`, and for `HALVES` `C1` after it.
///
/// # Safety
/// The configuration must be loaded; `base` must have two tiles' writable bytes,
/// 64-aligned.
#[inline(always)]
unsafe fn retire<const HALVES: bool, const C0: u8, const C1: u8>(base: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        amx::store::<C0>(base, 64);
        if HALVES {
            amx::store::<C1>(base.add(SUMS_TILE), 64);
        }
    }
}

/// Row `r`'s sums (of 32 values, or of a half) from tile `t` stored at `base`.
///
/// # Safety
/// The caller has AVX-512F; the tile has been stored.
#[inline(always)]
unsafe fn sums_row(base: *const u8, t: usize, r: usize) -> __m512i {
    // SAFETY: the caller's contract; the row is 64 aligned bytes.
    unsafe { _mm512_load_si512(base.add(t * SUMS_TILE + r * 64) as *const __m512i) }
}

/// Where a group's blocks lie, for [`unpack`].
struct GroupPtrs {
    q: *const u8,
    h: *const u8,
    hb: usize,
}

/// Block `b`'s eight quant vectors, unpacked as [`super::tile_nibbles`] does, stored as B
/// tile rows at `quads`.
///
/// # Safety
/// `p` must point to a group with block `b`, `quads` to 512 writable 64-aligned bytes; the
/// caller has AVX-512F and -BW.
#[inline(always)]
unsafe fn unpack<F: QuantFormat>(p: &GroupPtrs, b: usize, quads: *mut u8) {
    let block_bytes = GROUP * QK / 2;
    // SAFETY: (whole body) the caller's contract.
    unsafe {
        let low = Zmm::splat_i8(0x0F);
        let q = p.q.add(b * block_bytes);
        prefetch_block(q.wrapping_add(GROUP_PREFETCH), block_bytes);
        // The bits above the nibbles are a second stream, as far ahead in blocks.
        prefetch_block(
            p.h.wrapping_add((b + GROUP_PREFETCH / block_bytes) * p.hb),
            p.hb,
        );
        let mut v = [Zmm::zero_i(); 8];
        for j in 0..4 {
            let raw = Zmm::load(q.add(j * VEC_BYTES));
            v[j] = Zmm::and(raw, low);
            v[4 + j] = Zmm::and(Zmm::shr16::<4>(raw), low);
        }
        merge_high_bits::<Zmm, F>(&mut v, p.h.wrapping_add(b * p.hb));
        if let Some(table) = F::LUT {
            let lut = Zmm::table(&table);
            for n in &mut v {
                *n = Zmm::lookup(lut, *n);
            }
        }
        for (n, v) in v.iter().enumerate() {
            _mm512_store_si512(quads.add(n * VEC_BYTES) as *mut __m512i, *v);
        }
    }
}

/// A format's float steps for one block, from its stored sums: what [`pipeline`] runs on
/// the vector unit while the tile unit multiplies the next block.
trait BlockScale {
    /// Adds block `b`'s part to the 16 rows' accumulators, in the 512-bit tile's order.
    ///
    /// # Safety
    /// The block's numbers must be readable, its sums tiles stored at `sums`; the caller
    /// has AVX-512F and F16C.
    unsafe fn scale(&self, b: usize, sums: *const u8, acc: &mut [__m512; TILE_ROWS]);
}

/// What block `b`'s float steps read besides its sums: the group's scales, and the
/// activation rows' scales, sums and half sums.
struct Epilogue<F> {
    wd: *const f16,
    wm: *const f16,
    wsub: *const u8,
    sub_step: usize,
    wmh: *const u8,
    x: XRows,
    format: std::marker::PhantomData<F>,
}

/// Where the activation rows' numbers start, and the blocks per row.
struct XRows {
    d: *const f32,
    s: *const f32,
    offsets: *const [i32; 2],
    nb: usize,
    i: usize,
}

impl XRows {
    fn new(x: &Q8Rows, nb: usize, i: usize) -> Self {
        XRows {
            d: x.d.as_ptr(),
            s: x.s.as_ptr(),
            offsets: x.offsets.as_ptr(),
            nb,
            i,
        }
    }
}

// Index loops: `r` selects an accumulator, an activation row and a sums row.
#[allow(clippy::needless_range_loop)]
impl<F: QuantFormat> BlockScale for Epilogue<F> {
    /// [`super::tile_nibbles`]' float steps.
    #[inline(always)]
    unsafe fn scale(&self, b: usize, sums: *const u8, acc: &mut [__m512; TILE_ROWS]) {
        let x = &self.x;
        // SAFETY: (whole body) the trait's contract.
        unsafe {
            let at = if F::KQUANT { b / KSUB } else { b } * GROUP;
            let dsup = Zmm::scales(self.wd.add(at));
            let msup = if F::MINS {
                Zmm::scales(self.wm.add(at))
            } else {
                Zmm::zero_f()
            };
            // The minima's top bits for block b: its super-block's nibbles shifted on.
            let mins_hi = if F::SCALES == Scales::SubMin {
                let shift = _mm512_set1_epi32(4 * (b % KSUB) as i32);
                _mm512_srlv_epi32(Zmm::load(self.wmh.add(at * 4)), shift)
            } else {
                Zmm::zero_i()
            };
            let (dlo, dhi, mlo) = block_scales::<Zmm, F>(
                dsup,
                msup,
                self.wsub.wrapping_add(b * self.sub_step),
                mins_hi,
            );
            for r in 0..TILE_ROWS {
                let at = (x.i + r) * x.nb + b;
                let dx = Zmm::splat(*x.d.add(at));
                if F::SCALES == Scales::SubSigned {
                    let [olo, ohi] = *x.offsets.add(at);
                    let lo = _mm512_add_epi32(sums_row(sums, 0, r), Zmm::splat_i32(olo));
                    let hi = _mm512_add_epi32(sums_row(sums, 1, r), Zmm::splat_i32(ohi));
                    acc[r] = Zmm::fmadd(Zmm::cvt(lo), Zmm::mul(dlo, dx), acc[r]);
                    acc[r] = Zmm::fmadd(Zmm::cvt(hi), Zmm::mul(dhi, dx), acc[r]);
                    continue;
                }
                let isum = sums_row(sums, 0, r);
                acc[r] = Zmm::fmadd(Zmm::cvt(isum), Zmm::mul(dlo, dx), acc[r]);
                acc[r] = Zmm::fmadd(mlo, Zmm::splat(*x.s.add(at)), acc[r]);
            }
        }
    }
}

/// Q8_0's float steps: the group's block scales, and the activation rows'.
struct Q8Epilogue {
    wd: *const f16,
    x: XRows,
}

// Index loops: `r` selects an accumulator, an activation row and a sums row.
#[allow(clippy::needless_range_loop)]
impl BlockScale for Q8Epilogue {
    /// The 512-bit Q8_0 tile's float steps.
    #[inline(always)]
    unsafe fn scale(&self, b: usize, sums: *const u8, acc: &mut [__m512; TILE_ROWS]) {
        let x = &self.x;
        // SAFETY: (whole body) the trait's contract.
        unsafe {
            let dw = Zmm::scales(self.wd.add(b * GROUP));
            for r in 0..TILE_ROWS {
                let at = (x.i + r) * x.nb + b;
                let scale = Zmm::mul(dw, Zmm::splat(*x.d.add(at)));
                let isum = sums_row(sums, 0, r);
                acc[r] = Zmm::fmadd(Zmm::cvt(isum), scale, acc[r]);
            }
        }
    }
}

/// The products of `nb` blocks (B tiles at `q + b·512`, A tiles at `y + b·32`), pipelined
/// one deep: while the tile unit multiplies block `b + 1`, block `b`'s sums are stored and
/// block `b - 1`'s scaled by `e`. Consecutive blocks alternate between sums tiles 0-1 and
/// 2-3 (A tiles 4 and 5, B tiles 6 and 7, whole blocks using the first of each pair) and
/// between the halves of the sums scratch. (Two deep, over four sums tiles, measured no
/// faster.)
///
/// # Safety
/// The configuration for `HALVES` must be loaded (`Tiles`); `q` must hold nb blocks of B
/// tiles, `y` nb blocks of 16 activation rows `ldx` apart; `e` the numbers of nb blocks.
/// The caller has AVX-512F and F16C.
#[inline(always)]
unsafe fn pipeline<const HALVES: bool, const SIGNED: bool, E: BlockScale>(
    e: &E,
    nb: usize,
    q: *const u8,
    y: *const u8,
    ldx: usize,
) -> [[f32; GROUP]; TILE_ROWS] {
    let q = |b: usize| q.wrapping_add(b * 8 * VEC_BYTES);
    let y = |b: usize| y.wrapping_add(b * QK);
    let mut sums = MaybeUninit::<Sums>::uninit();
    let s = [0, 1].map(|n| Sums::part(&mut sums, n));
    // SAFETY: (whole body) the caller's contract. A set of sums tiles is stored the
    // iteration after it is issued, before it is issued again; a stored sums half is read
    // the iteration after and stored again the one after that; an A or B tile is loaded
    // again only after the product that read it has been stored.
    unsafe {
        let issue_at = |b: usize| {
            if b.is_multiple_of(2) {
                issue::<HALVES, SIGNED, 0, 1, 4, 6>(q(b), y(b), ldx);
            } else {
                issue::<HALVES, SIGNED, 2, 3, 5, 7>(q(b), y(b), ldx);
            }
        };
        let mut acc = [Zmm::zero_f(); TILE_ROWS];
        if nb > 0 {
            issue_at(0);
        }
        for b in 0..nb {
            if SIGNED {
                // Q8_0's B tiles are the matrix itself, streamed from memory.
                prefetch_block(q(b).wrapping_add(Q8_0_PREFETCH), 8 * VEC_BYTES);
            }
            if b.is_multiple_of(2) {
                retire::<HALVES, 0, 1>(s[0]);
            } else {
                retire::<HALVES, 2, 3>(s[1]);
            }
            if b + 1 < nb {
                issue_at(b + 1);
            }
            if b > 0 {
                e.scale(b - 1, s[(b - 1) % 2], &mut acc);
            }
        }
        if nb > 0 {
            e.scale(nb - 1, s[(nb - 1) % 2], &mut acc);
        }
        store_rows::<TILE_ROWS, Zmm>(acc)
    }
}

/// [`super::tile_nibbles`] with the integer sums from the tile unit, the weights' B tiles
/// at `bq` ([`GroupTiles`]).
#[inline(always)]
unsafe fn tile_nibbles<F: QuantFormat>(
    w: &QuantMatrix,
    g: usize,
    bq: *const u8,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; TILE_ROWS] {
    debug_assert_eq!(w.ty, F::TYPE);
    let nb = w.nb;
    let ldx = nb * QK;
    let scales_per_group = if F::KQUANT { nb / KSUB } else { nb };
    let at = g * scales_per_group * GROUP;
    let e = Epilogue::<F> {
        wd: w.d.as_ptr().wrapping_add(at),
        wm: w.mins.as_ptr().wrapping_add(at),
        wsub: w.sub.as_ptr().wrapping_add(g * nb * sub_bytes(w.ty)),
        sub_step: sub_bytes(w.ty),
        wmh: w.mins_hi.as_ptr().wrapping_add(at * 4),
        x: XRows::new(x, nb, i),
        format: std::marker::PhantomData,
    };
    let y = (x.qs.as_ptr() as *const u8).wrapping_add(i * ldx);
    // SAFETY: as `super::tile_nibbles`: group g holds nb blocks of scales (and minima) and
    // sub-block scales, `bq` its nb blocks of B tiles; activation rows i..i + 16 hold nb
    // blocks of quants, scales, sums and half sums. The tiles are configured (`Tiles`).
    unsafe {
        if F::SCALES == Scales::SubSigned {
            pipeline::<true, false, _>(&e, nb, bq, y, ldx)
        } else {
            pipeline::<false, false, _>(&e, nb, bq, y, ldx)
        }
    }
}

/// Q8_0: the group's 512 bytes per block (at `wq`) are the B tile as they lie, signed.
#[inline(always)]
unsafe fn tile_q8_0(
    w: &QuantMatrix,
    g: usize,
    wq: *const u8,
    x: &Q8Rows,
    i: usize,
) -> [[f32; GROUP]; TILE_ROWS] {
    let nb = w.nb;
    let e = Q8Epilogue {
        wd: w.d.as_ptr().wrapping_add(g * nb * GROUP),
        x: XRows::new(x, nb, i),
    };
    let ldx = nb * QK;
    let y = (x.qs.as_ptr() as *const u8).wrapping_add(i * ldx);
    // SAFETY: group g holds nb blocks of quants (at `wq`) and GROUP scales each;
    // activation rows i..i + 16 hold nb blocks of quants and scales. The tiles are
    // configured (`Tiles`).
    unsafe { pipeline::<false, true, _>(&e, nb, wq, y, ldx) }
}
