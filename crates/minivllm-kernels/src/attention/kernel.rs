//! The per-task arithmetic of [`paged_attention`](super::paged_attention): online softmax
//! over one KV chunk at a time, with the chunk states merged in chunk order.
//!
//! Every query row runs exactly the same operations whatever task computes it (a prefill
//! tile of any size, or a decode split over chunks), which keeps outputs batch-invariant:
//! - scores are computed for whole cache blocks by `micro.rs`, whose result for one
//!   (row, key) does not depend on the other rows in the product;
//! - a row's softmax update uses only the keys below its own limit;
//! - chunk boundaries are fixed positions (`chunk_len`), and chunk states merge in order.

use super::cache::Load;
use super::micro;
use super::{first_visible, AttnShape, KvSlice, SeqAttn};
use crate::simd::{self, simd_dispatch, Simd};

/// What the tasks of one call read.
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub query: &'a [f32],
    pub key_cache: KvSlice<'a>,
    pub value_cache: KvSlice<'a>,
    pub shape: &'a AttnShape<'a>,
    /// Positions per chunk: a whole number of blocks.
    pub chunk_len: usize,
}

impl Ctx<'_> {
    pub(super) fn state_len(&self) -> usize {
        2 + self.shape.head_dim
    }
}

/// One unit of parallel work.
pub(super) enum Task<'a> {
    /// Query tokens `t0..t0 + n` of `seq`, all heads; `out` is their `n` output rows.
    Tile {
        seq: SeqAttn<'a>,
        t0: usize,
        out: &'a mut [f32],
    },
    /// Chunk `chunk` of kv head `kv_head` for `seq`'s single (decode) token: the states of the
    /// group's query rows, into `states` (`[group, state_len]`).
    Chunk {
        seq: SeqAttn<'a>,
        kv_head: usize,
        chunk: usize,
        states: &'a mut [f32],
    },
    /// Merges the chunk states of a decode token (`[num_kv_heads, chunks, group, state_len]`)
    /// into its output row.
    Merge {
        states: &'a [f32],
        chunks: usize,
        out: &'a mut [f32],
    },
}

/// Scratch that one worker thread reuses across its tasks.
#[derive(Default)]
pub(super) struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    run: Vec<f32>,
    cur: Vec<f32>,
}

/// Signature of [`run_task`], so tests can run the driver over the portable variant.
pub(super) type TaskFn = fn(&Ctx<'_>, Task<'_>, &mut Scratch);

simd_dispatch! {
    /// Runs one task.
    pub(super) fn run_task(cx: &Ctx<'_>, task: Task<'_>, scratch: &mut Scratch);
    generic = run_task_generic;
    avx512 = crate::simd::Avx512;
    scalar = run_task_portable;
}

pub(super) fn run_task_portable(cx: &Ctx<'_>, task: Task<'_>, scratch: &mut Scratch) {
    run_task_generic(simd::Scalar, cx, task, scratch)
}

#[inline(always)]
fn run_task_generic<S: Simd>(s: S, cx: &Ctx<'_>, task: Task<'_>, scr: &mut Scratch) {
    match task {
        Task::Tile { seq, t0, out } => tile(s, cx, &seq, t0, out, scr),
        Task::Chunk {
            seq,
            kv_head,
            chunk,
            states,
        } => {
            let (g, hd) = (cx.shape.group(), cx.shape.head_dim);
            let t = seq.query_start;
            let q0 = (t * cx.shape.num_heads + kv_head * g) * hd;
            let q = &cx.query[q0..q0 + g * hd];
            let c0 = chunk * cx.chunk_len;
            let rows = RowSet {
                q,
                limit0: seq.context_len,
                group: g,
                window: cx.shape.sliding_window,
            };
            chunk_states(s, cx, &seq, kv_head, &rows, c0, states, &mut scr.scores);
        }
        Task::Merge {
            states,
            chunks,
            out,
        } => merge_decode(s, cx, states, chunks, out, scr),
    }
}

/// Query rows of consecutive tokens for one kv head: row `r` is head `r % group` of token
/// `r / group`, which attends to positions `first(r)..limit0 + r / group`.
struct RowSet<'a> {
    /// `[rows, head_dim]`.
    q: &'a [f32],
    limit0: usize,
    group: usize,
    window: Option<usize>,
}

impl RowSet<'_> {
    fn limit(&self, r: usize) -> usize {
        self.limit0 + r / self.group
    }

    /// Row `r`'s first visible position (after a sliding window).
    fn first(&self, r: usize) -> usize {
        first_visible(self.window, self.limit(r))
    }

    /// How many rows see some position before `p`: rows are ordered by window too, so those
    /// whose window starts at or after `p` are a suffix.
    fn seeing_before(&self, p: usize, n_rows: usize) -> usize {
        match self.window {
            None => n_rows,
            // first(r) < p  ⇔  limit0 + r / group < p + w.
            Some(w) => ((p + w).saturating_sub(self.limit0) * self.group).min(n_rows),
        }
    }

    /// The first row that attends to position `p` (all rows after it do too).
    fn first_seeing(&self, p: usize) -> usize {
        (p + 1).saturating_sub(self.limit0) * self.group
    }
}

/// The rows (of those before `r_end`) that read some position of the block at `b0`: they
/// reach it (`first_seeing`) and their window starts before its end (`seeing_before`).
#[inline(always)]
fn block_rows(rows: &RowSet<'_>, b0: usize, bs: usize, r_end: usize) -> (usize, usize) {
    (rows.first_seeing(b0), rows.seeing_before(b0 + bs, r_end))
}

/// Positions per softmax update (rounded down to whole blocks, at least one).
const SPAN_POSITIONS: usize = 64;

#[inline(always)]
fn tile<S: Simd>(
    s: S,
    cx: &Ctx<'_>,
    seq: &SeqAttn<'_>,
    t0: usize,
    out: &mut [f32],
    scr: &mut Scratch,
) {
    let sh = cx.shape;
    let (nh, hd, g) = (sh.num_heads, sh.head_dim, sh.group());
    let tokens = out.len() / (nh * hd);
    let rows = tokens * g;
    let sl = cx.state_len();
    // Token t0 sits at this position and attends to everything up to and including it.
    let limit0 = seq.context_len - seq.query_len + (t0 - seq.query_start) + 1;
    let end = limit0 + tokens - 1;
    for kvh in 0..sh.num_kv_heads {
        scr.q.clear();
        for t in t0..t0 + tokens {
            let q0 = (t * nh + kvh * g) * hd;
            scr.q.extend_from_slice(&cx.query[q0..q0 + g * hd]);
        }
        let set = RowSet {
            q: &scr.q,
            limit0,
            group: g,
            window: sh.sliding_window,
        };
        scr.run.resize(rows * sl, 0.0);
        scr.cur.resize(rows * sl, 0.0);
        let mut run = States::new(&mut scr.run, rows, hd);
        run.clear();
        // Chunks below every row's window are skipped (an empty state merges as nothing).
        let c_first = set.first(0) / cx.chunk_len * cx.chunk_len;
        for c0 in (c_first..end).step_by(cx.chunk_len) {
            chunk_states(s, cx, seq, kvh, &set, c0, &mut scr.cur, &mut scr.scores);
            for r in 0..rows {
                merge(s, &mut run, r, state_row(&scr.cur, rows, hd, r));
            }
        }
        for r in 0..rows {
            let head = kvh * g + r % g;
            let o = ((r / g) * nh + head) * hd;
            finish(s, &mut out[o..o + hd], &run, r, sh.sinks.map(|z| z[head]));
        }
    }
}

/// The online-softmax states of a set of rows, laid out in one buffer as
/// `[acc: rows × head_dim][max: rows][sum: rows]`.
struct States<'a> {
    acc: &'a mut [f32],
    max: &'a mut [f32],
    sum: &'a mut [f32],
    hd: usize,
}

impl<'a> States<'a> {
    fn new(buf: &'a mut [f32], rows: usize, hd: usize) -> Self {
        let (acc, rest) = buf.split_at_mut(rows * hd);
        let (max, rest) = rest.split_at_mut(rows);
        States {
            acc,
            max,
            sum: &mut rest[..rows],
            hd,
        }
    }

    fn clear(&mut self) {
        self.acc.fill(0.0);
        self.max.fill(f32::NEG_INFINITY);
        self.sum.fill(0.0);
    }
}

/// The states of `rows` over positions `c0..c0 + chunk_len` (each clipped to its limit) into
/// `buf`; a row with no position there gets an empty state.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn chunk_states<S: Simd>(
    s: S,
    cx: &Ctx<'_>,
    seq: &SeqAttn<'_>,
    kvh: usize,
    rows: &RowSet<'_>,
    c0: usize,
    buf: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let at = (seq, kvh, rows, c0);
    match (cx.key_cache, cx.value_cache) {
        (KvSlice::Float32(k), KvSlice::Float32(v)) => chunk_states_of(s, cx, k, v, at, buf, scores),
        (KvSlice::Float16(k), KvSlice::Float16(v)) => chunk_states_of(s, cx, k, v, at, buf, scores),
        (KvSlice::BFloat16(k), KvSlice::BFloat16(v)) => {
            chunk_states_of(s, cx, k, v, at, buf, scores)
        }
        _ => unreachable!("check_batch refuses caches of two element types"),
    }
}

/// [`chunk_states`] for caches of element type `T`.
#[allow(clippy::type_complexity)]
#[inline(always)]
fn chunk_states_of<S: Simd, T: Load>(
    s: S,
    cx: &Ctx<'_>,
    key_cache: &[T],
    value_cache: &[T],
    (seq, kvh, rows, c0): (&SeqAttn<'_>, usize, &RowSet<'_>, usize),
    buf: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let sh = cx.shape;
    let (hd, bs) = (sh.head_dim, sh.block_size);
    let n_rows = rows.q.len() / hd;
    let mut st = States::new(buf, n_rows, hd);
    st.clear();
    // The softmax state is updated once per span of a few blocks: its max, rescale and sums
    // are horizontal work, worth amortising over more keys than one block holds. Spans start
    // at fixed positions (the chunk's start, every `span`), so a row's arithmetic stays its own.
    let span = (SPAN_POSITIONS / bs).max(1) * bs;
    scores.resize(n_rows * span, 0.0);
    let c_end = (c0 + cx.chunk_len).min(rows.limit(n_rows - 1));
    // Spans wholly below the first row's window are skipped; spans keep their fixed starts.
    let p_first = c0 + rows.first(0).saturating_sub(c0) / span * span;
    for p0 in (p_first..c_end).step_by(span) {
        let p1 = (p0 + span).min(c_end);
        // Rows are ordered by limit: those that see position p0 are a suffix; with a sliding
        // window, those that see anything before p1 are a prefix.
        let r0 = rows.first_seeing(p0);
        if r0 >= n_rows {
            break;
        }
        let r_end = rows.seeing_before(p1, n_rows);
        for (k, b0) in (p0..p1).step_by(bs).enumerate() {
            // Rows whose window starts after this block leave it unread (their scores here
            // are masked below); a block no row reads may have been given back to the pool.
            let (rb, re) = block_rows(rows, b0, bs, r_end);
            if rb >= re {
                continue;
            }
            let (kt, vals) = sh.block(key_cache, value_cache, seq.block_table, b0, kvh);
            // A block's keys and values are a few KiB at an address the block table picks:
            // too short a stream for the hardware prefetcher to learn before it ends, so
            // decoding large batches waited on them. Ask for this block's values and the next
            // block's keys while this block's scores are computed.
            prefetch(s, vals);
            if b0 + bs < c_end {
                let (next, _) = sh.block(key_cache, value_cache, seq.block_table, b0 + bs, kvh);
                prefetch(s, next);
            }
            let sc = &mut scores[rb * span + k * bs..];
            micro::qk(s, &rows.q[rb * hd..re * hd], kt, sc, (hd, bs, span));
        }
        for r in r0..r_end {
            let n = p1.min(rows.limit(r)) - p0;
            let sc = &mut scores[r * span..r * span + n];
            // Positions before the window weigh nothing; each row here sees one at least.
            let hidden = rows.first(r).saturating_sub(p0);
            softmax_step(s, &mut st, r, sc, hidden, (sh.scale, sh.softcap));
        }
        for (k, b0) in (p0..p1).step_by(bs).enumerate() {
            let (mut r, re) = block_rows(rows, b0, bs, r_end);
            if r >= re {
                continue;
            }
            let (_, values) = sh.block(key_cache, value_cache, seq.block_table, b0, kvh);
            while r < re {
                // Rows of one token share a limit; near the diagonal, tokens see fewer keys.
                let n = bs.min(rows.limit(r) - b0);
                let mut end = r + 1;
                while end < re && bs.min(rows.limit(end) - b0) == n {
                    end += 1;
                }
                let acc = &mut st.acc[r * hd..end * hd];
                let p = &scores[r * span + k * bs..];
                micro::pv(s, acc, p, &values[..n * hd], n, hd, span);
                r = end;
            }
        }
    }
}

/// Hints that all of `x` will be read soon.
#[inline(always)]
fn prefetch<S: Simd, T>(s: S, x: &[T]) {
    let p = x.as_ptr().cast::<u8>();
    for off in (0..std::mem::size_of_val(x)).step_by(CACHE_LINE) {
        s.prefetch(p.wrapping_add(off).cast());
    }
}

const CACHE_LINE: usize = 64;

/// Folds one span's raw scores `sc` into row `r`'s max and sum (its first `hidden`, before
/// the row's window, weighing nothing), rescaling its accumulator if the max grew, and
/// leaves the span's probabilities (relative to the new max) in `sc`.
#[inline(always)]
fn softmax_step<S: Simd>(
    s: S,
    st: &mut States<'_>,
    r: usize,
    sc: &mut [f32],
    hidden: usize,
    (scale, cap): (f32, Option<f32>),
) {
    simd::scale(s, sc, scale);
    if let Some(cap) = cap {
        simd::softcap(s, sc, cap);
    }
    // After the cap, which would turn -inf into -cap.
    sc[..hidden].fill(f32::NEG_INFINITY);
    let old = st.max[r];
    let new = old.max(simd::max(s, sc));
    if new > old && old != f32::NEG_INFINITY {
        let alpha = (old - new).exp();
        simd::scale(s, &mut st.acc[r * st.hd..(r + 1) * st.hd], alpha);
        st.sum[r] *= alpha;
    }
    st.max[r] = new;
    st.sum[r] += simd::exp_shifted(s, sc, new);
}

/// Row `r` of a read-only states buffer of `rows` rows: (acc, max, sum).
fn state_row(buf: &[f32], rows: usize, hd: usize, r: usize) -> (&[f32], f32, f32) {
    (
        &buf[r * hd..(r + 1) * hd],
        buf[rows * hd + r],
        buf[rows * hd + rows + r],
    )
}

/// Merges a state `(acc, max, sum)` over positions after those of `run`'s row `r` into it.
#[inline(always)]
fn merge<S: Simd>(s: S, run: &mut States<'_>, r: usize, (pacc, pm, ps): (&[f32], f32, f32)) {
    let rm = run.max[r];
    if pm == f32::NEG_INFINITY {
        return;
    }
    let hd = run.hd;
    let acc = &mut run.acc[r * hd..(r + 1) * hd];
    if rm == f32::NEG_INFINITY {
        acc.copy_from_slice(pacc);
        run.max[r] = pm;
        run.sum[r] = ps;
        return;
    }
    let m = rm.max(pm);
    let (a, b) = ((rm - m).exp(), (pm - m).exp());
    run.max[r] = m;
    run.sum[r] = run.sum[r] * a + ps * b;
    simd::scale(s, acc, a);
    simd::axpy(s, acc, b, pacc);
}

/// The attention output of row `r`'s finished state; a `sink` logit adds its weight to the
/// softmax's sum (and nothing to the values').
#[inline(always)]
fn finish<S: Simd>(s: S, out: &mut [f32], st: &States<'_>, r: usize, sink: Option<f32>) {
    out.copy_from_slice(&st.acc[r * st.hd..(r + 1) * st.hd]);
    let sum = match sink {
        Some(z) => st.sum[r] + (z - st.max[r]).exp(),
        None => st.sum[r],
    };
    simd::scale(s, out, 1.0 / sum);
}

#[inline(always)]
fn merge_decode<S: Simd>(
    s: S,
    cx: &Ctx<'_>,
    states: &[f32],
    chunks: usize,
    out: &mut [f32],
    scr: &mut Scratch,
) {
    let (g, hd, sl) = (cx.shape.group(), cx.shape.head_dim, cx.state_len());
    scr.run.resize(sl, 0.0);
    for (head, o) in out.chunks_exact_mut(hd).enumerate() {
        let (kvh, r) = (head / g, head % g);
        let mut run = States::new(&mut scr.run, 1, hd);
        run.max[0] = f32::NEG_INFINITY;
        for c in 0..chunks {
            let at = (kvh * chunks + c) * g * sl;
            merge(
                s,
                &mut run,
                0,
                state_row(&states[at..at + g * sl], g, hd, r),
            );
        }
        finish(s, o, &run, 0, cx.shape.sinks.map(|z| z[head]));
    }
}
