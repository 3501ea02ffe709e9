//! Paged attention over a block-structured KV cache.
//!
//! The work splits into (token, kv head) items: the query heads sharing a kv head are
//! contiguous in both `query` and `out`, so each item owns a disjoint slice of the output
//! and reads each key and value once for the whole group. Scores for one block of keys are a
//! small matrix product (`group × block_size`) done by the matmul micro-kernel; softmax is
//! two-pass over a per-thread scratch row.

use crate::matmul::{gemm_nt_generic, Gemm};
use crate::simd::{self, simd_dispatch, Simd};
use rayon::prelude::*;

/// Below this many multiply-adds in a batch, attention stays on the calling thread.
const PAR_MIN_WORK: usize = 1 << 15;

/// Shapes shared by the attention kernels of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    /// Usually `1 / sqrt(head_dim)`.
    pub scale: f32,
}

impl AttnShape {
    /// Query heads sharing one kv head.
    fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Offset in a cache of the `head_dim` values of `kv_head` at logical `pos` of `block_table`.
    #[inline]
    fn cache_offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let block = block_table[pos / self.block_size] as usize;
        ((block * self.num_kv_heads + kv_head) * self.block_size + pos % self.block_size)
            * self.head_dim
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
    }

    /// Floats in one cache block.
    fn block_len(&self) -> usize {
        self.num_kv_heads * self.block_size * self.head_dim
    }
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
pub fn reshape_and_cache(
    key: &[f32],
    value: &[f32],
    key_cache: &mut [f32],
    value_cache: &mut [f32],
    slot_mapping: &[usize],
    shape: &AttnShape,
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
        for h in 0..shape.num_kv_heads {
            let src = (t * shape.num_kv_heads + h) * shape.head_dim;
            let dst = ((block * shape.num_kv_heads + h) * shape.block_size
                + slot % shape.block_size)
                * shape.head_dim;
            let n = shape.head_dim;
            key_cache[dst..dst + n].copy_from_slice(&key[src..src + n]);
            value_cache[dst..dst + n].copy_from_slice(&value[src..src + n]);
        }
    }
}

/// `out[t, h, :]` = attention of query `[t, h, :]` over its sequence's cached keys/values,
/// with GQA (query head h reads kv head `h / (num_heads / num_kv_heads)`).
pub fn paged_attention(
    out: &mut [f32],
    query: &[f32],
    key_cache: &[f32],
    value_cache: &[f32],
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape,
) {
    paged_attention_with(
        attend_group,
        out,
        query,
        key_cache,
        value_cache,
        seqs,
        shape,
    );
}

/// Signature of [`attend_group`], so tests can run the batch driver over other variants.
type AttendFn = fn(&mut [f32], &[f32], &KvView<'_>, &mut Vec<f32>);

/// The keys and values one (token, kv head) item attends over.
#[derive(Clone, Copy)]
struct KvView<'a> {
    key_cache: &'a [f32],
    value_cache: &'a [f32],
    block_table: &'a [u32],
    /// Positions `0..context` are attended.
    context: usize,
    kv_head: usize,
    shape: &'a AttnShape,
}

impl<'a> KvView<'a> {
    /// The rows of `cache` for this kv head in the block starting at position `p0`
    /// (`[len, head_dim]`, contiguous in the cache layout), and `len`.
    #[inline(always)]
    fn block_rows(&self, cache: &'a [f32], p0: usize) -> (&'a [f32], usize) {
        let len = self.shape.block_size.min(self.context - p0);
        let off = self.shape.cache_offset(self.block_table, p0, self.kv_head);
        (&cache[off..off + len * self.shape.head_dim], len)
    }
}

/// [`paged_attention`] with `attend` doing each (token, kv head) item.
fn paged_attention_with(
    attend: AttendFn,
    out: &mut [f32],
    query: &[f32],
    key_cache: &[f32],
    value_cache: &[f32],
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape,
) {
    check_batch(out, query, key_cache, value_cache, seqs, shape);
    let (hd, nkv) = (shape.head_dim, shape.num_kv_heads);
    let item = shape.group() * hd;
    if item == 0 {
        return;
    }
    let num_tokens = query.len() / (shape.num_heads * hd);
    // Which sequence each token of the flat batch belongs to (u32::MAX: none, left alone).
    let mut owner = vec![u32::MAX; num_tokens];
    let mut work = 0;
    for (i, s) in seqs.iter().enumerate() {
        owner[s.query_start..s.query_start + s.query_len].fill(i as u32);
        work += s.query_len * s.context_len * shape.num_heads * hd;
    }
    let run = |scores: &mut Vec<f32>, (idx, o): (usize, &mut [f32])| {
        let t = idx / nkv;
        let Some(s) = seqs.get(owner[t] as usize) else {
            return;
        };
        let kv = KvView {
            key_cache,
            value_cache,
            block_table: s.block_table,
            context: s.context_len - s.query_len + (t - s.query_start) + 1,
            kv_head: idx % nkv,
            shape,
        };
        attend(o, &query[idx * item..][..item], &kv, scores);
    };
    if work < PAR_MIN_WORK || rayon::current_num_threads() == 1 {
        let mut scores = Vec::new();
        out.chunks_mut(item)
            .enumerate()
            .for_each(|it| run(&mut scores, it));
    } else {
        out.par_chunks_mut(item)
            .enumerate()
            .for_each_init(Vec::new, run);
    }
}

simd_dispatch! {
    /// Attention of the `group` query heads `q` (`[group, head_dim]`) that share `kv`'s
    /// head, into `out` (`[group, head_dim]`). `scores` is scratch.
    fn attend_group(out: &mut [f32], q: &[f32], kv: &KvView<'_>, scores: &mut Vec<f32>);
    generic = attend_group_generic;
    avx512 = crate::simd::Avx2;
    scalar = attend_group_portable;
}

fn attend_group_portable(out: &mut [f32], q: &[f32], kv: &KvView<'_>, scores: &mut Vec<f32>) {
    attend_group_generic(simd::Scalar, out, q, kv, scores)
}

#[inline(always)]
fn attend_group_generic<S: Simd>(
    s: S,
    out: &mut [f32],
    q: &[f32],
    kv: &KvView<'_>,
    scores: &mut Vec<f32>,
) {
    let (hd, bs, group, context) = (
        kv.shape.head_dim,
        kv.shape.block_size,
        kv.shape.group(),
        kv.context,
    );
    assert!(
        q.len() == group * hd && out.len() == group * hd,
        "attend_group: bad q/out"
    );
    scores.clear();
    scores.resize(group * context, 0.0);
    for p0 in (0..context).step_by(bs) {
        let (keys, len) = kv.block_rows(kv.key_cache, p0);
        let g = Gemm {
            x: q.as_ptr(),
            ldx: hd,
            w: keys.as_ptr(),
            ldw: hd,
            out: scores.as_mut_ptr().wrapping_add(p0),
            ldo: context,
            m: group,
            n: len,
            k: hd,
        };
        // SAFETY: q holds `group` rows of hd, `keys` `len` rows of hd, and rows of `scores`
        // (stride `context`) have room for columns p0..p0 + len.
        unsafe { gemm_nt_generic(s, g) };
    }
    for row in scores.chunks_exact_mut(context) {
        simd::scale(s, row, kv.shape.scale);
        let max = simd::max(s, row);
        let sum = simd::exp_shifted::<S, true>(s, row, max);
        simd::scale(s, row, 1.0 / sum);
    }
    out.fill(0.0);
    for p0 in (0..context).step_by(bs) {
        let (values, len) = kv.block_rows(kv.value_cache, p0);
        for (o, p) in out.chunks_exact_mut(hd).zip(scores.chunks_exact(context)) {
            simd::add_weighted_rows(s, o, &p[p0..p0 + len], values);
        }
    }
}

fn check_batch(
    out: &[f32],
    query: &[f32],
    key_cache: &[f32],
    value_cache: &[f32],
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape,
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
        let used = s.context_len.div_ceil(shape.block_size);
        assert!(
            s.block_table[..used]
                .iter()
                .all(|&b| (b as usize) < num_blocks),
            "paged_attention: seq {i} block table names a block beyond the cache"
        );
    }
}

/// Scalar twin of [`paged_attention`]: single-threaded, two-pass softmax.
pub fn paged_attention_scalar(
    out: &mut [f32],
    query: &[f32],
    key_cache: &[f32],
    value_cache: &[f32],
    seqs: &[SeqAttn<'_>],
    shape: &AttnShape,
) {
    check_batch(out, query, key_cache, value_cache, seqs, shape);
    let hd = shape.head_dim;
    let mut scores = Vec::new();
    for s in seqs {
        for i in 0..s.query_len {
            let t = s.query_start + i;
            let last = s.context_len - s.query_len + i;
            for h in 0..shape.num_heads {
                let kvh = h / shape.group();
                let q = &query[(t * shape.num_heads + h) * hd..][..hd];
                scores.clear();
                for pos in 0..=last {
                    let k = &key_cache[shape.cache_offset(s.block_table, pos, kvh)..][..hd];
                    let dot: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
                    scores.push(dot * shape.scale);
                }
                crate::softmax::softmax_inplace_scalar(&mut scores);
                let o = &mut out[(t * shape.num_heads + h) * hd..][..hd];
                o.fill(0.0);
                for (pos, &p) in scores.iter().enumerate() {
                    let v = &value_cache[shape.cache_offset(s.block_table, pos, kvh)..][..hd];
                    for (o, &v) in o.iter_mut().zip(v) {
                        *o += p * v;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use rand::seq::SliceRandom;

    /// A batch with its logical (un-paged) keys/values, for the reference.
    struct Batch {
        shape: AttnShape,
        query: Vec<f32>,
        key_cache: Vec<f32>,
        value_cache: Vec<f32>,
        seqs: Vec<TestSeq>,
    }

    struct TestSeq {
        query_start: usize,
        query_len: usize,
        context_len: usize,
        block_table: Vec<u32>,
        /// Logical `[context_len, num_kv_heads, head_dim]`.
        keys: Vec<f32>,
        values: Vec<f32>,
    }

    impl Batch {
        fn seq_attn(&self) -> Vec<SeqAttn<'_>> {
            self.seqs
                .iter()
                .map(|s| SeqAttn {
                    query_start: s.query_start,
                    query_len: s.query_len,
                    context_len: s.context_len,
                    block_table: &s.block_table,
                })
                .collect()
        }
    }

    /// Builds a batch of `(query_len, context_len)` sequences whose blocks are shuffled
    /// over the cache, filled through `reshape_and_cache`.
    fn make_batch(seed: u64, shape: AttnShape, lens: &[(usize, usize)]) -> Batch {
        let mut r = rng(seed);
        let bs = shape.block_size;
        let total_blocks: usize = lens.iter().map(|&(_, c)| c.div_ceil(bs)).sum::<usize>() + 3;
        let mut free: Vec<u32> = (0..total_blocks as u32).collect();
        free.shuffle(&mut r);
        let cache_len = total_blocks * shape.block_len();
        let mut key_cache = rand_vec(&mut r, cache_len); // garbage where nothing is written
        let mut value_cache = rand_vec(&mut r, cache_len);
        let kv_row = shape.num_kv_heads * shape.head_dim;
        let mut seqs = Vec::new();
        let mut start = 0;
        for &(ql, cl) in lens {
            let table: Vec<u32> = (0..cl.div_ceil(bs)).map(|_| free.pop().unwrap()).collect();
            let k = rand_vec(&mut r, cl * kv_row);
            let v = rand_vec(&mut r, cl * kv_row);
            let slots: Vec<usize> = (0..cl)
                .map(|p| table[p / bs] as usize * bs + p % bs)
                .collect();
            reshape_and_cache(&k, &v, &mut key_cache, &mut value_cache, &slots, &shape);
            seqs.push(TestSeq {
                query_start: start,
                query_len: ql,
                context_len: cl,
                block_table: table,
                keys: k,
                values: v,
            });
            start += ql;
        }
        let query = rand_vec(&mut r, start * shape.num_heads * shape.head_dim);
        Batch {
            shape,
            query,
            key_cache,
            value_cache,
            seqs,
        }
    }

    /// f64 attention over the logical keys/values.
    fn reference(b: &Batch) -> Vec<f32> {
        let AttnShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            scale,
            ..
        } = b.shape;
        let mut out = vec![0.0; b.query.len()];
        for s in &b.seqs {
            let (qs, ql, cl, k, v) = (
                s.query_start,
                s.query_len,
                s.context_len,
                &s.keys,
                &s.values,
            );
            for i in 0..ql {
                let t = qs + i;
                let last = cl - ql + i;
                for h in 0..nh {
                    let kvh = h / (nh / nkv);
                    let q = &b.query[(t * nh + h) * hd..][..hd];
                    let s: Vec<f64> = (0..=last)
                        .map(|p| {
                            let kr = &k[(p * nkv + kvh) * hd..][..hd];
                            q.iter()
                                .zip(kr)
                                .map(|(&a, &b)| a as f64 * b as f64)
                                .sum::<f64>()
                                * scale as f64
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let acc: f64 = (0..=last)
                            .map(|p| e[p] * v[(p * nkv + kvh) * hd + d] as f64)
                            .sum();
                        out[(t * nh + h) * hd + d] = (acc / z) as f32;
                    }
                }
            }
        }
        out
    }

    fn shapes() -> Vec<(AttnShape, Vec<(usize, usize)>)> {
        let s = |nh, nkv, hd: usize, bs| AttnShape {
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        vec![
            // SmolLM2: GQA 9/3, mixed prefill (with and without a cached prefix) and decodes.
            (
                s(9, 3, 64, 16),
                vec![(5, 5), (1, 37), (7, 40), (1, 1), (1, 16), (20, 20)],
            ),
            // Odd head_dim and block size, multi-query.
            (s(4, 1, 13, 3), vec![(1, 10), (4, 4), (2, 9)]),
            // Plain multi-head, one-token blocks.
            (s(2, 2, 8, 1), vec![(3, 5), (1, 2)]),
        ]
    }

    #[test]
    fn scalar_matches_reference() {
        for (i, (shape, lens)) in shapes().into_iter().enumerate() {
            let b = make_batch(10 + i as u64, shape, &lens);
            let mut out = vec![0.0; b.query.len()];
            paged_attention_scalar(
                &mut out,
                &b.query,
                &b.key_cache,
                &b.value_cache,
                &b.seq_attn(),
                &shape,
            );
            assert_close(&out, &reference(&b), 1e-5, 1e-4, "paged_attention_scalar");
        }
    }

    fn check_with(seed: u64, what: &str, attend: AttendFn) {
        for (i, (shape, lens)) in shapes().into_iter().enumerate() {
            let b = make_batch(seed + i as u64, shape, &lens);
            let mut out = vec![0.0; b.query.len()];
            let seqs = b.seq_attn();
            let (q, kc, vc) = (&b.query, &b.key_cache, &b.value_cache);
            paged_attention_with(attend, &mut out, q, kc, vc, &seqs, &shape);
            assert_close(&out, &reference(&b), 1e-5, 1e-4, what);
        }
    }

    #[test]
    fn dispatch_matches_reference() {
        check_with(20, "paged_attention", attend_group);
    }

    #[test]
    fn portable_matches_reference() {
        check_with(30, "attend_group_portable", attend_group_portable);
    }

    #[test]
    fn tokens_outside_seqs_are_untouched() {
        let (shape, _) = shapes().remove(0);
        let b = make_batch(40, shape, &[(3, 9), (1, 20)]);
        let mut seqs = b.seq_attn();
        // Leave tokens 1 and 2 (the end of the first prefill) out, and list the seqs backwards.
        seqs[0].query_len = 1;
        seqs[0].context_len = 7;
        seqs.swap(0, 1);
        let row = shape.num_heads * shape.head_dim;
        let (q, kc, vc) = (&b.query, &b.key_cache, &b.value_cache);
        let mut want = vec![0.0; q.len()];
        paged_attention_scalar(&mut want, q, kc, vc, &seqs, &shape);
        let mut got = vec![0.0; q.len()];
        paged_attention(&mut got, q, kc, vc, &seqs, &shape);
        assert_close(&got, &want, 1e-5, 1e-4, "partial batch");
        assert!(got[row..3 * row].iter().all(|&v| v == 0.0));
        assert!(got[..row].iter().any(|&v| v != 0.0));
    }

    #[test]
    fn reshape_and_cache_places_rows() {
        let shape = AttnShape {
            num_heads: 2,
            num_kv_heads: 2,
            head_dim: 3,
            block_size: 4,
            scale: 1.0,
        };
        let mut kc = vec![0.0; 3 * shape.block_len()];
        let mut vc = kc.clone();
        let key: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let value: Vec<f32> = key.iter().map(|v| -v).collect();
        // Token 0 -> block 2 offset 1, token 1 -> block 0 offset 3.
        reshape_and_cache(&key, &value, &mut kc, &mut vc, &[9, 3], &shape);
        let at = |b: usize, h: usize, o: usize| ((b * 2 + h) * 4 + o) * 3;
        assert_eq!(&kc[at(2, 0, 1)..][..3], &[0.0, 1.0, 2.0]);
        assert_eq!(&kc[at(2, 1, 1)..][..3], &[3.0, 4.0, 5.0]);
        assert_eq!(&kc[at(0, 0, 3)..][..3], &[6.0, 7.0, 8.0]);
        assert_eq!(&vc[at(0, 1, 3)..][..3], &[-9.0, -10.0, -11.0]);
        assert_eq!(kc.iter().filter(|&&v| v != 0.0).count(), 11);
    }

    #[test]
    fn empty_batch_is_noop() {
        let shape = AttnShape {
            num_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            block_size: 2,
            scale: 0.5,
        };
        paged_attention(&mut [], &[], &[], &[], &[], &shape);
        reshape_and_cache(&[], &[], &mut [], &mut [], &[], &shape);
    }
}
