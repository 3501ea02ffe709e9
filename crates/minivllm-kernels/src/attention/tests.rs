use super::*;
use crate::testutil::*;
use rand::seq::SliceRandom;

/// A batch with its logical (un-paged) keys/values, for the reference.
struct Batch {
    shape: AttnShape<'static>,
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
fn make_batch(seed: u64, shape: AttnShape<'static>, lens: &[(usize, usize)]) -> Batch {
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
        sliding_window,
        sinks,
        softcap,
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
            let first = sliding_window.map_or(0, |w| (last + 1).saturating_sub(w));
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let q = &b.query[(t * nh + h) * hd..][..hd];
                let s: Vec<f64> = (first..=last)
                    .map(|p| {
                        let kr = &k[(p * nkv + kvh) * hd..][..hd];
                        q.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .map(|x| softcap.map_or(x, |c| f64::from(c) * (x / f64::from(c)).tanh()))
                    .collect();
                // transformers' gpt-oss: the sink joins the scores, and its probability is
                // dropped.
                let sink = sinks.map(|z| f64::from(z[h]));
                let m = s
                    .iter()
                    .chain(&sink)
                    .copied()
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |z| (z - m).exp());
                for d in 0..hd {
                    let acc: f64 = (first..=last)
                        .map(|p| e[p - first] * v[(p * nkv + kvh) * hd + d] as f64)
                        .sum();
                    out[(t * nh + h) * hd + d] = (acc / z) as f32;
                }
            }
        }
    }
    out
}

fn windowed(shape: AttnShape<'static>, window: usize) -> AttnShape<'static> {
    AttnShape {
        sliding_window: Some(window),
        ..shape
    }
}

/// `shape` with a sink per head, drawn in ±4 (some above every score, some below).
fn sinked(shape: AttnShape<'static>, seed: u64) -> AttnShape<'static> {
    let sinks: Vec<f32> = rand_vec(&mut rng(seed), shape.num_heads)
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    AttnShape {
        sinks: Some(Box::leak(sinks.into_boxed_slice())),
        ..shape
    }
}

/// `shape` with Gemma 2's score soft-capping at `cap`.
fn capped(shape: AttnShape<'static>, cap: f32) -> AttnShape<'static> {
    AttnShape {
        softcap: Some(cap),
        ..shape
    }
}

fn shapes() -> Vec<(AttnShape<'static>, Vec<(usize, usize)>)> {
    let s = |nh, nkv, hd: usize, bs| AttnShape {
        num_heads: nh,
        num_kv_heads: nkv,
        head_dim: hd,
        block_size: bs,
        block_stride: None,
        scale: 1.0 / (hd as f32).sqrt(),
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    vec![
        // SmolLM2: GQA 9/3, mixed prefill (with and without a cached prefix) and decodes.
        (
            s(9, 3, 64, 16),
            vec![(5, 5), (1, 37), (7, 40), (1, 1), (1, 16), (20, 20)],
        ),
        // Contexts over several 256-position chunks: a long prefill tile and long decodes.
        (
            s(6, 2, 32, 16),
            vec![(40, 600), (1, 513), (1, 256), (1, 257), (70, 70)],
        ),
        // Odd head_dim and block size, multi-query.
        (s(4, 1, 13, 3), vec![(1, 10), (4, 4), (2, 9)]),
        // Plain multi-head, one-token blocks.
        (s(2, 2, 8, 1), vec![(3, 5), (1, 2)]),
        // Sliding windows: spanning chunks (a prefill tile whose rows start in different
        // chunks, decodes that skip whole chunks), shorter than a block, of one position.
        (
            windowed(s(6, 2, 32, 16), 100),
            vec![(40, 600), (1, 513), (1, 256), (1, 90), (70, 70), (300, 300)],
        ),
        (windowed(s(4, 1, 13, 3), 5), vec![(1, 10), (9, 9), (2, 9)]),
        (windowed(s(2, 2, 8, 4), 1), vec![(6, 6), (1, 7)]),
        // gpt-oss's sinks: on full layers, and on sliding ones (window 128 there).
        (
            sinked(s(8, 2, 16, 16), 5),
            vec![(40, 600), (1, 513), (1, 37), (9, 9)],
        ),
        (
            sinked(windowed(s(8, 2, 16, 16), 20), 6),
            vec![(40, 300), (1, 257), (1, 7), (30, 30)],
        ),
        // Gemma 2's soft-capping, low enough to bite on these scores, with its windows.
        (
            capped(s(9, 3, 64, 16), 0.3),
            vec![(5, 5), (1, 37), (40, 600), (1, 513)],
        ),
        (
            capped(windowed(s(4, 1, 13, 3), 5), 0.2),
            vec![(1, 10), (9, 9)],
        ),
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

fn check_with(seed: u64, what: &str, run: TaskFn) {
    for (i, (shape, lens)) in shapes().into_iter().enumerate() {
        let b = make_batch(seed + i as u64, shape, &lens);
        let mut out = vec![0.0; b.query.len()];
        let seqs = b.seq_attn();
        let (q, kc, vc) = (&b.query, &b.key_cache, &b.value_cache);
        paged_attention_with(run, &mut out, q, kc.into(), vc.into(), &seqs, &shape);
        assert_close(&out, &reference(&b), 1e-5, 1e-4, what);
    }
}

#[test]
fn dispatch_matches_reference() {
    check_with(20, "paged_attention", kernel::run_task);
}

#[test]
fn portable_matches_reference() {
    check_with(30, "run_task_portable", kernel::run_task_portable);
}

/// Half-precision caches: both kernels agree with the scalar twin over the same rounded
/// cache (the kernels widen each value exactly), and with the f32 reference up to that
/// rounding.
#[test]
fn half_precision_caches_match_scalar() {
    fn check<T: KvElem>(run: TaskFn, what: &str, ref_tol: f32) {
        for (i, (shape, lens)) in shapes().into_iter().enumerate() {
            let b = make_batch(60 + i as u64, shape, &lens);
            let kc: Vec<T> = b.key_cache.iter().map(|&x| T::from_f32(x)).collect();
            let vc: Vec<T> = b.value_cache.iter().map(|&x| T::from_f32(x)).collect();
            let seqs = b.seq_attn();
            let mut want = vec![0.0; b.query.len()];
            paged_attention_scalar(&mut want, &b.query, &kc, &vc, &seqs, &shape);
            let mut got = vec![0.0; b.query.len()];
            paged_attention_with(
                run,
                &mut got,
                &b.query,
                (&kc).into(),
                (&vc).into(),
                &seqs,
                &shape,
            );
            let what = format!("{what} {}", T::DTYPE);
            assert_close(&got, &want, 1e-5, 1e-4, &what);
            assert_close(&got, &reference(&b), ref_tol, ref_tol, &what);
        }
    }
    for (run, what) in [
        (kernel::run_task as TaskFn, "dispatched"),
        (kernel::run_task_portable, "portable"),
    ] {
        check::<half::f16>(run, what, 3e-3);
        check::<half::bf16>(run, what, 3e-2);
    }
}

/// A sliding-window layer's blocks behind the first query's window may be given back to the
/// pool (the KV cache manager marks them `u32::MAX`): no kernel reads them, and the output is
/// bit for bit that of the whole table.
#[test]
fn blocks_behind_every_window_are_never_read() {
    let mut checked = 0;
    for (i, (shape, lens)) in shapes().into_iter().enumerate() {
        let Some(w) = shape.sliding_window else {
            continue;
        };
        let b = make_batch(70 + i as u64, shape, &lens);
        let whole = b.seq_attn();
        let mut cut = b.seq_attn();
        let tables: Vec<Vec<u32>> = b
            .seqs
            .iter()
            .map(|s| {
                let first = (s.context_len - s.query_len + 1).saturating_sub(w) / shape.block_size;
                checked += first;
                let mut t = s.block_table.clone();
                t[..first].fill(u32::MAX);
                t
            })
            .collect();
        for (s, t) in cut.iter_mut().zip(&tables) {
            s.block_table = t;
        }
        let (q, kc, vc) = (&b.query, &b.key_cache, &b.value_cache);
        for run in [kernel::run_task as TaskFn, kernel::run_task_portable] {
            let mut want = vec![0.0; q.len()];
            paged_attention_with(run, &mut want, q, kc.into(), vc.into(), &whole, &shape);
            let mut got = vec![0.0; q.len()];
            paged_attention_with(run, &mut got, q, kc.into(), vc.into(), &cut, &shape);
            assert_eq!(got, want, "{shape:?}");
        }
        let mut want = vec![0.0; q.len()];
        paged_attention_scalar(&mut want, q, kc, vc, &whole, &shape);
        let mut got = vec![0.0; q.len()];
        paged_attention_scalar(&mut got, q, kc, vc, &cut, &shape);
        assert_eq!(got, want, "scalar {shape:?}");
    }
    assert!(checked > 10, "only {checked} blocks given back");
}

#[test]
fn reshape_and_cache_rounds_to_the_cache_type() {
    let shape = AttnShape {
        num_heads: 1,
        num_kv_heads: 1,
        head_dim: 2,
        block_size: 2,
        block_stride: None,
        scale: 1.0,
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    let mut kc = KvBuffer::zeros(KvCacheDtype::BFloat16, shape.block_len());
    let mut vc = KvBuffer::zeros(KvCacheDtype::BFloat16, shape.block_len());
    let x = 1.0 + 1.0 / 512.0; // not a bf16: rounds to 1 (ties to even)
    reshape_and_cache(
        &[x, 3.0],
        &[x, -2.5],
        kc.view_mut(),
        vc.view_mut(),
        &[1],
        &shape,
    );
    // Keys transposed: [dim, offset]; values [offset, dim].
    assert_eq!([kc.get(1), kc.get(3)], [1.0, 3.0]);
    assert_eq!([vc.get(2), vc.get(3)], [1.0, -2.5]);
    assert_eq!(kc.get(0), 0.0);
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
        block_stride: None,
        scale: 1.0,
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    let mut kc = vec![0.0; 3 * shape.block_len()];
    let mut vc = kc.clone();
    let key: Vec<f32> = (0..12).map(|v| v as f32).collect();
    let value: Vec<f32> = key.iter().map(|v| -v).collect();
    // Token 0 -> block 2 offset 1, token 1 -> block 0 offset 3.
    reshape_and_cache(&key, &value, &mut kc, &mut vc, &[9, 3], &shape);
    // Values are [block, head, offset, dim]; keys [block, head, dim, offset].
    let at = |b: usize, h: usize, o: usize| ((b * 2 + h) * 4 + o) * 3;
    let key_at = |b: usize, h: usize, o: usize| -> Vec<f32> {
        (0..3).map(|d| kc[(b * 2 + h) * 12 + d * 4 + o]).collect()
    };
    assert_eq!(key_at(2, 0, 1), [0.0, 1.0, 2.0]);
    assert_eq!(key_at(2, 1, 1), [3.0, 4.0, 5.0]);
    assert_eq!(key_at(0, 0, 3), [6.0, 7.0, 8.0]);
    assert_eq!(&vc[at(2, 0, 1)..][..3], &[-0.0, -1.0, -2.0]);
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
        block_stride: None,
        scale: 0.5,
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    // A cache with contents, which a batch of no tokens must leave as it is.
    let mut kc: Vec<f32> = (0..2 * shape.block_len()).map(|v| v as f32).collect();
    let mut vc: Vec<f32> = kc.iter().map(|v| -v).collect();
    let (k0, v0) = (kc.clone(), vc.clone());
    paged_attention(&mut [], &[], &kc[..], &vc[..], &[], &shape);
    reshape_and_cache(&[], &[], &mut kc[..], &mut vc[..], &[], &shape);
    assert_eq!((kc, vc), (k0, v0));
}

/// Runs `paged_attention` in a pool of `threads` (tile sizes depend on the thread count).
fn attend_in_pool(threads: usize, b: &Batch, seqs: &[SeqAttn<'_>]) -> Vec<f32> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let mut out = vec![0.0; b.query.len()];
    pool.install(|| {
        paged_attention(
            &mut out,
            &b.query,
            &b.key_cache,
            &b.value_cache,
            seqs,
            &b.shape,
        )
    });
    out
}

/// A token's output bits do not depend on how its batch is split into tasks: a prefill
/// token equals the same token run alone as a decode, whatever the thread count and
/// whatever else is in the batch.
#[test]
fn rows_are_batch_invariant() {
    for (i, (shape, _)) in shapes().into_iter().enumerate() {
        let b = make_batch(50 + i as u64, shape, &[(37, 300), (1, 290), (5, 5)]);
        let row = shape.num_heads * shape.head_dim;
        let all = b.seq_attn();
        let together = attend_in_pool(2, &b, &all);
        for threads in [1, 3] {
            let alone = attend_in_pool(threads, &b, &all[..1]);
            assert_eq!(
                &alone[..37 * row],
                &together[..37 * row],
                "{threads} threads"
            );
        }
        let first = all[0];
        for t in [0, 1, 17, 36] {
            let decode = SeqAttn {
                query_start: t,
                query_len: 1,
                context_len: first.context_len - first.query_len + t + 1,
                ..first
            };
            let out = attend_in_pool(2, &b, &[decode]);
            assert_eq!(
                &out[t * row..(t + 1) * row],
                &together[t * row..(t + 1) * row],
                "shape {i}: prefill token {t} vs the same token as a decode"
            );
        }
    }
}

/// The block micro-kernels against plain loops, and a row's bits independent of its
/// neighbours, on odd shapes.
fn check_micro<S: crate::simd::Simd>(s: S) {
    let mut r = rng(60);
    for (rows, hd, bs) in [
        (1, 64, 16),
        (7, 64, 16),
        (5, 13, 3),
        (9, 17, 9),
        (4, 8, 1),
        (3, 40, 24),
    ] {
        let q = rand_vec(&mut r, rows * hd);
        let kt = rand_vec(&mut r, hd * bs);
        let mut scores = vec![0.0; rows * bs];
        micro::qk(s, &q, &kt, &mut scores, (hd, bs, bs));
        for i in 0..rows {
            for j in 0..bs {
                let want: f32 = (0..hd).map(|d| q[i * hd + d] * kt[d * bs + j]).sum();
                let got = scores[i * bs + j];
                assert!((got - want).abs() < 1e-5, "qk {rows}x{hd}x{bs} [{i},{j}]");
            }
        }
        let mut last = vec![0.0; bs];
        micro::qk(s, &q[(rows - 1) * hd..], &kt, &mut last, (hd, bs, bs));
        assert_eq!(last, scores[(rows - 1) * bs..], "qk row alone");

        let v = rand_vec(&mut r, bs * hd);
        let acc0 = rand_vec(&mut r, rows * hd);
        for n in [bs, bs.div_ceil(2)] {
            let mut acc = acc0.clone();
            micro::pv(s, &mut acc, &scores, &v, n, hd, bs);
            for i in 0..rows {
                for x in 0..hd {
                    let want = acc0[i * hd + x]
                        + (0..n)
                            .map(|j| scores[i * bs + j] * v[j * hd + x])
                            .sum::<f32>();
                    let got = acc[i * hd + x];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "pv {rows}x{hd}x{bs} n {n} [{i},{x}]"
                    );
                }
            }
            let mut alone = acc0[(rows - 1) * hd..].to_vec();
            micro::pv(s, &mut alone, &scores[(rows - 1) * bs..], &v, n, hd, bs);
            assert_eq!(alone, acc[(rows - 1) * hd..], "pv row alone");
        }
    }
}

#[test]
fn micro_kernels_scalar() {
    check_micro(crate::simd::Scalar);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn micro_kernels_avx2() {
    match crate::simd::Avx2::new() {
        Some(s) => check_micro(s),
        None => eprintln!("SKIPPED micro_kernels_avx2: this CPU has no AVX2"),
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn micro_kernels_avx512() {
    if let Some(s) = crate::simd::Avx512::new() {
        check_micro(s);
    }
}

/// Blocks `block_stride` apart (a layer narrower than the cache's blocks, as Gemma 4's):
/// each block's rows go in its first part, the rest stays untouched, and attention over
/// them gives what it gives over packed blocks.
#[test]
fn a_block_stride_keeps_each_block_in_its_first_part() {
    let packed = AttnShape {
        num_heads: 2,
        num_kv_heads: 2,
        head_dim: 3,
        block_size: 4,
        block_stride: None,
        scale: 0.5,
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    let strided = AttnShape {
        block_stride: Some(3 * packed.block_len()),
        ..packed
    };
    let mut r = rng(7);
    // Six tokens in blocks 2 then 0.
    let (key, value, q) = (
        rand_vec(&mut r, 36),
        rand_vec(&mut r, 36),
        rand_vec(&mut r, 36),
    );
    let slots = [8, 9, 10, 11, 0, 1];
    let table = [2u32, 0];
    let seqs = [SeqAttn {
        query_start: 0,
        query_len: 6,
        context_len: 6,
        block_table: &table,
    }];
    let mut outs = Vec::new();
    for shape in [packed, strided] {
        let mut kc = vec![0.0; 3 * shape.block_len()];
        let mut vc = kc.clone();
        reshape_and_cache(&key, &value, &mut kc, &mut vc, &slots, &shape);
        if shape.block_stride.is_some() {
            let own = packed.block_len();
            for b in 0..3 {
                let rest = b * shape.block_len() + own..(b + 1) * shape.block_len();
                assert!(kc[rest.clone()].iter().chain(&vc[rest]).all(|&v| v == 0.0));
            }
        }
        let mut out = vec![0.0; q.len()];
        paged_attention(&mut out, &q, &kc[..], &vc[..], &seqs, &shape);
        outs.push(out);
    }
    assert_eq!(outs[0], outs[1]);
}

#[test]
fn le_bytes_round_trip_every_element_type() {
    for dtype in [
        KvCacheDtype::Float32,
        KvCacheDtype::Float16,
        KvCacheDtype::BFloat16,
    ] {
        let mut from = KvBuffer::zeros(dtype, 12);
        for i in 0..12 {
            from.copy_from(i, &value_buffer(dtype, i as f32 * 0.75 - 3.0), 0, 1);
        }
        let mut bytes = Vec::new();
        from.append_le_bytes(3, 6, &mut bytes);
        assert_eq!(bytes.len(), 6 * dtype.size(), "{dtype}");
        let mut to = KvBuffer::zeros(dtype, 12);
        to.set_le_bytes(5, &bytes);
        for i in 0..12 {
            let want = if (5..11).contains(&i) {
                from.get(i - 2)
            } else {
                0.0
            };
            assert_eq!(to.get(i), want, "{dtype} element {i}");
        }
    }
}

/// A one-element buffer holding `x`.
fn value_buffer(dtype: KvCacheDtype, x: f32) -> KvBuffer {
    let mut b = KvBuffer::zeros(dtype, 1);
    b.fill(x);
    b
}
