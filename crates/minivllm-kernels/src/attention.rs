//! Paged attention over a block-structured KV cache.
//!
//! Flash-style: no score matrix is ever whole. Each query row keeps an online-softmax state
//! (running max, sum and weighted values) while it walks its keys block by block, so memory
//! stays bounded whatever the context. Positions are cut into fixed chunks; a row's chunk
//! states are merged in chunk order, which lets a decode token spread one long context over
//! all threads while giving the bits a prefill row gets (see `kernel.rs`).
//!
//! Prefill tokens go in tiles: the query heads of a GQA group, for several consecutive tokens,
//! share each key and value block read (one small matmul per block). Decode tokens are split
//! by (kv head, chunk), then their chunk states are merged.

mod cache;
mod kernel;
mod micro;

pub(crate) use cache::Load;
pub use cache::{KvBuffer, KvCacheDtype, KvElem, KvSlice, KvSliceMut};
use kernel::{Ctx, Scratch, Task, TaskFn};
use rayon::prelude::*;

/// Positions per chunk (rounded down to whole blocks): small enough that one decode token's
/// context splits over the threads, large enough that merging states costs little.
const CHUNK_POSITIONS: usize = 256;

/// Below this many multiply-adds in a batch, attention stays on the calling thread.
const PAR_MIN_WORK: usize = 1 << 15;

/// Shapes shared by the attention kernels of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape<'s> {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Floats from one cache block to the next, where the cache's blocks are wider than
    /// this layer's (`None`: `num_kv_heads × block_size × head_dim`). Gemma 4's layers differ
    /// in width but share block ids, each layer's blocks in the first part of a block of
    /// the widest layer's size.
    pub block_stride: Option<usize>,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
    /// A query at position `p` sees only positions `p + 1 - w ..= p` (Mistral's and Gemma's
    /// sliding-window layers); `None` sees the whole context.
    pub sliding_window: Option<usize>,
    /// gpt-oss's attention sinks, one logit per query head: each joins its head's softmax as
    /// one more score that has no value, so a head may attend to nothing much.
    pub sinks: Option<&'s [f32]>,
    /// Gemma 2's soft-capping of the scores: each scaled score `x` becomes
    /// `cap · tanh(x / cap)` before the softmax ([`softcap`]).
    pub softcap: Option<f32>,
}

/// `cap · tanh(x / cap)`, as `cap · (1 - 2 / (1 + e^(2x / cap)))`: the form the vector code
/// computes (it saturates to ±cap without a NaN), so the scalar paths give the same values.
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * (1.0 - 2.0 / (1.0 + (2.0 * x / cap).exp()))
}

impl AttnShape<'_> {
    /// Query heads sharing one kv head.
    fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Offset in a cache of `kv_head`'s part of the block holding logical `pos`.
    #[inline]
    fn head_block_offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        block * self.block_len() + kv_head * self.block_size * self.head_dim
    }

    /// `kv_head`'s keys (`[head_dim, block_size]`) and values (`[block_size, head_dim]`) in the
    /// block holding logical `pos`.
    #[inline]
    fn block<'c, T>(
        &self,
        key_cache: &'c [T],
        value_cache: &'c [T],
        block_table: &[u32],
        pos: usize,
        kv_head: usize,
    ) -> (&'c [T], &'c [T]) {
        let off = self.head_block_offset(block_table, pos, kv_head);
        let n = self.block_size * self.head_dim;
        (&key_cache[off..off + n], &value_cache[off..off + n])
    }

    fn check(&self) {
        assert!(
            self.num_kv_heads > 0 && self.num_heads.is_multiple_of(self.num_kv_heads),
            "attention: num_heads {} is not a multiple of num_kv_heads {}",
            self.num_heads,
            self.num_kv_heads
        );
        assert!(
            self.block_size > 0,
            "attention: block_size must be positive"
        );
        assert!(
            self.block_stride
                .is_none_or(|s| s >= self.num_kv_heads * self.block_size * self.head_dim),
            "attention: a block stride narrower than the layer's blocks"
        );
        assert!(
            self.sliding_window != Some(0),
            "attention: a sliding window must hold at least one position"
        );
        if let Some(sinks) = self.sinks {
            assert_eq!(
                sinks.len(),
                self.num_heads,
                "attention: one sink per query head"
            );
        }
    }

    /// The first position a query that sees up to `limit` (exclusive) attends to.
    #[inline]
    fn first_visible(&self, limit: usize) -> usize {
        first_visible(self.sliding_window, limit)
    }

    /// Floats from one cache block to the next.
    fn block_len(&self) -> usize {
        (self.block_stride).unwrap_or(self.num_kv_heads * self.block_size * self.head_dim)
    }
}

/// The first position a query that sees up to `limit` (exclusive) attends to, under a
/// sliding `window`.
#[inline]
fn first_visible(window: Option<usize>, limit: usize) -> usize {
    window.map_or(0, |w| limit.saturating_sub(w))
}

/// One sequence's part of a flat batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqAttn<'a> {
    /// Index of this sequence's first new token in the flat batch.
    pub query_start: usize,
    /// Number of new tokens (prompt chunk length, or 1 for a decode).
    pub query_len: usize,
    /// Tokens in the cache once the new ones are written (cached prefix + new).
    /// New token `i` sits at position `context_len - query_len + i` and attends to
    /// positions `0..=that` (causal within the new tokens, full over the prefix).
    pub context_len: usize,
    /// Physical block ids holding positions `0..context_len`, in order.
    pub block_table: &'a [u32],
}

/// Writes each new token's key and value (`[num_tokens, num_kv_heads, head_dim]`) into the
/// caches at `slot_mapping[t]` (slot = block_id * block_size + offset).
///
/// A cache block holds, for each kv head, its values as `[block_size, head_dim]` and its keys
/// transposed, `[head_dim, block_size]`, so that the scores of a block are a product with
/// no horizontal sums.
pub fn reshape_and_cache<'c>(
    key: &[f32],
    value: &[f32],
    key_cache: impl Into<KvSliceMut<'c>>,
    value_cache: impl Into<KvSliceMut<'c>>,
    slot_mapping: &[usize],
    shape: &AttnShape<'_>,
) {
    use KvSliceMut as M;
    match (key_cache.into(), value_cache.into()) {
        (M::Float32(kc), M::Float32(vc)) => write_cache(key, value, kc, vc, slot_mapping, shape),
        (M::Float16(kc), M::Float16(vc)) => write_cache(key, value, kc, vc, slot_mapping, shape),
        (M::BFloat16(kc), M::BFloat16(vc)) => write_cache(key, value, kc, vc, slot_mapping, shape),
        _ => panic!("reshape_and_cache: key and value caches differ in element type"),
    }
}

fn write_cache<T: KvElem>(
    key: &[f32],
    value: &[f32],
    key_cache: &mut [T],
    value_cache: &mut [T],
    slot_mapping: &[usize],
    shape: &AttnShape<'_>,
) {
    shape.check();
    let row = shape.num_kv_heads * shape.head_dim;
    assert_eq!(
        key.len(),
        slot_mapping.len() * row,
        "reshape_and_cache: key must be [num_tokens, num_kv_heads, head_dim]"
    );
    assert_eq!(
        value.len(),
        key.len(),
        "reshape_and_cache: key and value differ in length"
    );
    assert_eq!(
        key_cache.len(),
        value_cache.len(),
        "reshape_and_cache: caches differ in length"
    );
    if row == 0 {
        return;
    }
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let block = slot / shape.block_size;
        assert!(
            (block + 1) * shape.block_len() <= key_cache.len(),
            "reshape_and_cache: slot {slot} is beyond the cache"
        );
        let (bs, hd) = (shape.block_size, shape.head_dim);
        let off = slot % bs;
        for h in 0..shape.num_kv_heads {
            let src = (t * shape.num_kv_heads + h) * hd;
            let base = block * shape.block_len() + h * bs * hd;
            for (d, &k) in key[src..src + hd].iter().enumerate() {
                key_cache[base + d * bs + off] = T::from_f32(k);
            }
            let dst = base + off * hd;
            for (c, &v) in value_cache[dst..dst + hd]
                .iter_mut()
                .zip(&value[src..src + hd])
            {
                *c = T::from_f32(v);
            }
        }
    }
}

/// `out[t, h, :]` = attention of query `[t, h, :]` over its sequence's cached keys/values,
/// with GQA (query head h reads kv head `h / (num_heads / num_kv_heads)`). Tokens of `query`
/// that no sequence covers are left alone in `out`.
pub fn paged_attention<'c>(
    out: &mut [f32],
    query: &[f32],
    key_cache: impl Into<KvSlice<'c>>,
    value_cache: impl Into<KvSlice<'c>>,
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape<'_>,
) {
    paged_attention_with(
        kernel::run_task,
        out,
        query,
        key_cache.into(),
        value_cache.into(),
        seqs,
        shape,
    );
}

/// [`paged_attention`] with `run` doing each task.
fn paged_attention_with(
    run: TaskFn,
    out: &mut [f32],
    query: &[f32],
    key_cache: KvSlice<'_>,
    value_cache: KvSlice<'_>,
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape<'_>,
) {
    check_batch(out, query, key_cache, value_cache, seqs, shape);
    let row = shape.num_heads * shape.head_dim;
    if row == 0 {
        return;
    }
    let cx = Ctx {
        query,
        key_cache,
        value_cache,
        shape,
        chunk_len: (CHUNK_POSITIONS / shape.block_size).max(1) * shape.block_size,
    };
    let work: usize = seqs.iter().map(|s| s.query_len * s.context_len * row).sum();
    let parallel = work >= PAR_MIN_WORK && rayon::current_num_threads() > 1;
    let plan = plan(&cx, out, seqs, parallel);
    let mut states = vec![0.0; plan.states_len(&cx)];
    let (mut tasks, decodes) = plan.tasks(&cx, &mut states);
    run_all(run, &cx, &mut tasks, parallel);
    let mut rest = &states[..];
    let mut merges = Vec::with_capacity(decodes.len());
    for (seq, out) in decodes {
        let chunks = seq.context_len.div_ceil(cx.chunk_len);
        let (mine, tail) = rest.split_at(decode_states_len(&cx, &seq));
        rest = tail;
        merges.push(Task::Merge {
            states: mine,
            chunks,
            out,
        });
    }
    run_all(run, &cx, &mut merges, parallel);
}

/// Floats of chunk states a decode token needs: `[num_kv_heads, chunks, group, state_len]`.
fn decode_states_len(cx: &Ctx<'_>, seq: &SeqAttn<'_>) -> usize {
    let sh = cx.shape;
    let chunks = seq.context_len.div_ceil(cx.chunk_len);
    sh.num_kv_heads * chunks * sh.group() * cx.state_len()
}

fn run_all(run: TaskFn, cx: &Ctx<'_>, tasks: &mut Vec<Task<'_>>, parallel: bool) {
    if parallel {
        tasks
            .par_drain(..)
            .for_each_init(Scratch::default, |scr, t| run(cx, t, scr));
    } else {
        let mut scr = Scratch::default();
        tasks.drain(..).for_each(|t| run(cx, t, &mut scr));
    }
}

/// How a batch splits into tasks: prefill tokens in tiles, decode tokens by chunk.
struct Plan<'s, 'o> {
    /// Prefill sequences' output rows, in tiles of `tile_tokens` tokens.
    prefills: Vec<(SeqAttn<'s>, &'o mut [f32])>,
    decodes: Vec<(SeqAttn<'s>, &'o mut [f32])>,
    tile_tokens: usize,
}

/// Carves `out` into the rows of each sequence and sizes the work.
fn plan<'s, 'o>(
    cx: &Ctx<'_>,
    out: &'o mut [f32],
    seqs: &[SeqAttn<'s>],
    parallel: bool,
) -> Plan<'s, 'o> {
    let sh = cx.shape;
    let row = sh.num_heads * sh.head_dim;
    let mut order: Vec<SeqAttn<'s>> = seqs.iter().filter(|s| s.query_len > 0).copied().collect();
    order.sort_by_key(|s| s.query_start);
    let (mut prefills, mut decodes) = (Vec::new(), Vec::new());
    let (mut rest, mut at) = (out, 0);
    for s in order {
        assert!(
            s.query_start >= at,
            "paged_attention: sequences overlap in the batch"
        );
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((s.query_start - at) * row);
        let (mine, tail) = tail.split_at_mut(s.query_len * row);
        (rest, at) = (tail, s.query_start + s.query_len);
        if s.query_len == 1 {
            decodes.push((s, mine));
        } else {
            prefills.push((s, mine));
        }
    }
    // Tiles of up to ~64 query rows keep a tile's queries and states in L1/L2; with few
    // prefill tokens, smaller tiles give every thread work. Tile size does not change results.
    let prefill_tokens: usize = prefills.iter().map(|(s, _)| s.query_len).sum();
    let per_thread = prefill_tokens.div_ceil(4 * rayon::current_num_threads());
    let max_tile = (64 / sh.group()).max(1);
    let tile_tokens = if parallel {
        per_thread.clamp(1, max_tile)
    } else {
        max_tile
    };
    Plan {
        prefills,
        decodes,
        tile_tokens,
    }
}

impl<'s, 'o> Plan<'s, 'o> {
    /// Floats of chunk states for all decode tokens, one after the other.
    fn states_len(&self, cx: &Ctx<'_>) -> usize {
        self.decodes
            .iter()
            .map(|(seq, _)| decode_states_len(cx, seq))
            .sum()
    }

    /// The first-phase tasks (prefill tiles and decode chunks, writing into `states`) and the
    /// decode tokens still to merge.
    #[allow(clippy::type_complexity)]
    fn tasks<'t>(
        self,
        cx: &Ctx<'_>,
        states: &'t mut [f32],
    ) -> (Vec<Task<'t>>, Vec<(SeqAttn<'s>, &'o mut [f32])>)
    where
        's: 't,
        'o: 't,
    {
        let row = cx.shape.num_heads * cx.shape.head_dim;
        let mut tasks = Vec::new();
        for (seq, out) in self.prefills {
            for (i, out) in out.chunks_mut(self.tile_tokens * row).enumerate() {
                let t0 = seq.query_start + i * self.tile_tokens;
                tasks.push(Task::Tile { seq, t0, out });
            }
        }
        let per_chunk = cx.shape.group() * cx.state_len();
        let mut rest = states;
        for (seq, _) in &self.decodes {
            let chunks = seq.context_len.div_ceil(cx.chunk_len);
            let (mine, tail) = rest.split_at_mut(decode_states_len(cx, seq));
            rest = tail;
            for (i, states) in mine.chunks_exact_mut(per_chunk).enumerate() {
                tasks.push(Task::Chunk {
                    seq: *seq,
                    kv_head: i / chunks,
                    chunk: i % chunks,
                    states,
                });
            }
        }
        (tasks, self.decodes)
    }
}

fn check_batch(
    out: &[f32],
    query: &[f32],
    key_cache: KvSlice<'_>,
    value_cache: KvSlice<'_>,
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape<'_>,
) {
    shape.check();
    let row = shape.num_heads * shape.head_dim;
    assert_eq!(
        out.len(),
        query.len(),
        "paged_attention: out and query differ in length"
    );
    assert_eq!(
        key_cache.len(),
        value_cache.len(),
        "paged_attention: caches differ in length"
    );
    assert_eq!(
        key_cache.dtype(),
        value_cache.dtype(),
        "paged_attention: key and value caches differ in element type"
    );
    let num_blocks = key_cache.len() / shape.block_len().max(1);
    for (i, s) in seqs.iter().enumerate() {
        assert!(
            (s.query_start + s.query_len) * row <= query.len(),
            "paged_attention: seq {i} queries lie beyond the batch"
        );
        assert!(
            s.query_len <= s.context_len,
            "paged_attention: seq {i} has query_len > context_len"
        );
        assert!(
            s.block_table.len() * shape.block_size >= s.context_len,
            "paged_attention: seq {i} block table is too short for context_len {}",
            s.context_len
        );
        // Blocks behind the first query's window are never read, and may be gone.
        let first = shape.first_visible(s.context_len - s.query_len + 1) / shape.block_size;
        let used = s.context_len.div_ceil(shape.block_size);
        assert!(
            s.block_table[first..used]
                .iter()
                .all(|&b| (b as usize) < num_blocks),
            "paged_attention: seq {i} block table names a block beyond the cache"
        );
    }
}

/// Scalar twin of [`paged_attention`]: single-threaded, two-pass softmax.
pub fn paged_attention_scalar<'c>(
    out: &mut [f32],
    query: &[f32],
    key_cache: impl Into<KvSlice<'c>>,
    value_cache: impl Into<KvSlice<'c>>,
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape<'_>,
) {
    let (key_cache, value_cache) = (key_cache.into(), value_cache.into());
    check_batch(out, query, key_cache, value_cache, seqs, shape);
    let (hd, bs) = (shape.head_dim, shape.block_size);
    let mut scores = Vec::new();
    for s in seqs {
        for i in 0..s.query_len {
            let t = s.query_start + i;
            let last = s.context_len - s.query_len + i;
            for h in 0..shape.num_heads {
                let kvh = h / shape.group();
                let q = &query[(t * shape.num_heads + h) * hd..][..hd];
                scores.clear();
                let first = shape.first_visible(last + 1);
                for pos in first..=last {
                    // Keys are stored transposed in their block: [head_dim, block_size].
                    let at = shape.head_block_offset(s.block_table, pos, kvh) + pos % bs;
                    let dot: f32 = (0..hd).map(|d| q[d] * key_cache.get(at + d * bs)).sum();
                    let x = dot * shape.scale;
                    scores.push(shape.softcap.map_or(x, |cap| softcap(x, cap)));
                }
                // A sink is one more score whose probability is dropped.
                if let Some(sinks) = shape.sinks {
                    scores.push(sinks[h]);
                }
                crate::softmax::softmax_inplace_scalar(&mut scores);
                if shape.sinks.is_some() {
                    scores.pop();
                }
                let o = &mut out[(t * shape.num_heads + h) * hd..][..hd];
                o.fill(0.0);
                for (pos, &p) in (first..).zip(&scores) {
                    let at = shape.head_block_offset(s.block_table, pos, kvh) + (pos % bs) * hd;
                    for (x, o) in o.iter_mut().enumerate() {
                        *o += p * value_cache.get(at + x);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
