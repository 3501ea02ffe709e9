//! Throughput of the main kernels at SmolLM2-135M shapes (not a timed test).
//!
//! `cargo run --release -p minivllm-kernels --example bench [threads]`; set `MINIVLLM_ISA`
//! to compare instruction sets. `bench THREADS matmul M K N ITERS` runs one product a fixed
//! number of times, to be timed by CPU time (`/usr/bin/time`): on a machine shared with
//! other work, CPU seconds say more than wall-clock ones. `bench THREADS prefill` repeats the
//! 512-token prefill attention, for profilers. `bench THREADS quant [head|all]` times the
//! quantised products (`all`: every format the tiles hold).

use minivllm_kernels::attention::{paged_attention, reshape_and_cache, AttnShape, SeqAttn};
use minivllm_kernels::matmul::matmul;
use minivllm_kernels::{cpu, threading};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Best time of `f` over repeats lasting about `budget` in total.
fn best_time(budget: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let start = Instant::now();
    let mut best = Duration::MAX;
    while start.elapsed() < budget {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
    }
    best
}

fn filled(len: usize, seed: u32) -> Vec<f32> {
    // A cheap deterministic pattern in [-1, 1): benchmarks need no statistical quality.
    (0..len as u32)
        .map(|i| {
            ((i.wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32)
                * 2.0
                - 1.0
        })
        .collect()
}

fn bench_matmul(m: usize, k: usize, n: usize) {
    let x = filled(m * k, 1);
    let w = filled(n * k, 2);
    let mut out = vec![0.0; m * n];
    let t = best_time(Duration::from_millis(600), || {
        matmul(black_box(&x), black_box(&w), &mut out, m, k, n)
    });
    let gflops = 2.0 * (m * k * n) as f64 / t.as_secs_f64() / 1e9;
    let gbs = (n * k * 4) as f64 / t.as_secs_f64() / 1e9;
    println!("matmul m={m:4} k={k:5} n={n:5}: {:9.1} us  {gflops:6.1} GFLOP/s  {gbs:5.1} GB/s of weights", t.as_secs_f64() * 1e6);
}

fn bench_qmatmul(ty: minivllm_kernels::quant::GgmlType, m: usize, k: usize, n: usize) {
    use minivllm_kernels::qmatmul::{matmul_quant, QuantMatrix};
    let x = filled(m * k, 1);
    use minivllm_kernels::quant::GgmlType::{Q4_0, Q4_1, Q8_0};
    // Q8_0 blocks of the pattern; Q4 formats reuse its bytes as random nibbles. Other
    // formats are quantised from it (slower to make, same work to multiply).
    let q8 = minivllm_kernels::qdot::quantize_q8_0(&filled(n * k, 2));
    let size = ty.type_size();
    let data: Vec<u8> = if matches!(ty, Q4_0 | Q4_1 | Q8_0) {
        q8.chunks_exact(34)
            .flat_map(|b| {
                let mut blk = b[..size.min(34)].to_vec();
                blk[2..4].copy_from_slice(&b[..2]);
                blk
            })
            .collect()
    } else {
        minivllm_kernels::qdot::quantize_to(ty, &filled(n * k, 2)).expect("a quantiser")
    };
    let q = QuantMatrix::new(ty, n, k, data).unwrap();
    let mut out = vec![0.0; m * n];
    let t = best_time(Duration::from_millis(600), || {
        matmul_quant(black_box(&x), &q, &mut out, m)
    });
    let gflops = 2.0 * (m * k * n) as f64 / t.as_secs_f64() / 1e9;
    let gbs = q.nbytes() as f64 / t.as_secs_f64() / 1e9;
    println!(
        "{:6} m={m:4} k={k:5} n={n:5}: {:9.1} us  {gflops:6.1} GFLOP/s  {gbs:5.1} GB/s of weights",
        ty.name(),
        t.as_secs_f64() * 1e6
    );
}

/// `seqs` sequences of `(query_len, context_len)`, SmolLM2 heads, block size 16.
fn bench_attention(label: &str, lens: &[(usize, usize)]) {
    let shape = AttnShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        block_size: 16,
        block_stride: None,
        scale: 0.125,
        sliding_window: None,
        sinks: None,
        softcap: None,
    };
    let blocks: Vec<usize> = lens
        .iter()
        .map(|&(_, c)| c.div_ceil(shape.block_size))
        .collect();
    let total_blocks: usize = blocks.iter().sum();
    let block_len = shape.num_kv_heads * shape.block_size * shape.head_dim;
    let mut kc = vec![0.0; total_blocks * block_len];
    let mut vc = kc.clone();
    let mut tables = Vec::new();
    let mut next = 0u32;
    for (&(_, c), &b) in lens.iter().zip(&blocks) {
        // Reverse order so block tables are not trivially sequential.
        let table: Vec<u32> = (next..next + b as u32).rev().collect();
        next += b as u32;
        let kv = filled(c * shape.num_kv_heads * shape.head_dim, next);
        let slots: Vec<usize> = (0..c)
            .map(|p| table[p / 16] as usize * 16 + p % 16)
            .collect();
        reshape_and_cache(&kv, &kv, &mut kc, &mut vc, &slots, &shape);
        tables.push(table);
    }
    let mut start = 0;
    let seqs: Vec<SeqAttn> = lens
        .iter()
        .zip(&tables)
        .map(|(&(q, c), t)| {
            let s = SeqAttn {
                query_start: start,
                query_len: q,
                context_len: c,
                block_table: t,
            };
            start += q;
            s
        })
        .collect();
    let q = filled(start * shape.num_heads * shape.head_dim, 9);
    let mut out = vec![0.0; q.len()];
    let t = best_time(Duration::from_millis(600), || {
        paged_attention(&mut out, black_box(&q), &kc, &vc, &seqs, &shape)
    });
    println!("attention {label:32}: {:9.1} us", t.as_secs_f64() * 1e6);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(2);
    threading::init_threads(threads);
    if args.get(2).map(String::as_str) == Some("matmul") {
        let num: Vec<usize> = args[3..7]
            .iter()
            .map(|a| a.parse().expect("M K N ITERS"))
            .collect();
        let (m, k, n, iters) = (num[0], num[1], num[2], num[3]);
        let (x, w) = (filled(m * k, 1), filled(n * k, 2));
        let mut out = vec![0.0; m * n];
        for _ in 0..iters {
            matmul(black_box(&x), black_box(&w), &mut out, m, k, n);
        }
        println!("{} flops", 2 * m * k * n * iters);
        return;
    }
    if args.get(2).map(String::as_str) == Some("prefill") {
        // A long run of one attention case, for profilers.
        for _ in 0..10 {
            bench_attention("prefill 512", &[(512, 512)]);
        }
        return;
    }
    println!("isa {:?}, {} threads", cpu::isa(), threading::num_threads());
    if args.get(2).map(String::as_str) == Some("qshape") {
        // One product: `qshape TYPE M K N` (a model's matrix, e.g. its LM head).
        use minivllm_kernels::quant::GgmlType::*;
        let ty = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4]
            .into_iter()
            .find(|t| Some(t.name()) == args.get(3).map(String::as_str))
            .expect("qshape TYPE M K N, TYPE a GGML name such as Q6_K");
        let num: Vec<usize> = args[4..7]
            .iter()
            .map(|a| a.parse().expect("qshape TYPE M K N"))
            .collect();
        bench_qmatmul(ty, num[0], num[1], num[2]);
        return;
    }
    if args.get(2).map(String::as_str) == Some("quant")
        && args.get(3).map(String::as_str) == Some("all")
    {
        // Every format the tiles hold, at shapes whose rows are whole K-quant super-blocks.
        use minivllm_kernels::quant::GgmlType::*;
        for &(k, n) in &[(1536, 576), (1024, 1536)] {
            for &m in &[1, 16, 512] {
                for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K] {
                    bench_qmatmul(ty, m, k, n);
                }
            }
        }
        return;
    }
    if args.get(2).map(String::as_str) == Some("quant") {
        use minivllm_kernels::quant::GgmlType::*;
        let shapes: &[(usize, usize)] = if args.get(3).map(String::as_str) == Some("head") {
            &[(576, 49152), (2048, 32000)]
        } else {
            &[(576, 1536), (1536, 576), (576, 960)]
        };
        for &(k, n) in shapes {
            for &m in &[1, 4, 16, 64, 512] {
                if n > 10_000 && m > 16 {
                    continue;
                }
                bench_matmul(m, k, n);
                for ty in [Q4_0, Q4_1, Q8_0] {
                    bench_qmatmul(ty, m, k, n);
                }
            }
        }
        return;
    }
    for &(k, n) in &[(576, 1536), (1536, 576), (576, 960), (576, 49152)] {
        for &m in &[1, 4, 512] {
            if n == 49152 && m == 512 {
                continue;
            }
            bench_matmul(m, k, n);
        }
    }
    bench_attention("decode 1 seq ctx 512", &[(1, 512)]);
    bench_attention("decode 8 seqs ctx 512", &[(1, 512); 8]);
    bench_attention("prefill 512", &[(512, 512)]);
    bench_attention(
        "mixed: prefill 128 + 4 decodes",
        &[(128, 128), (1, 300), (1, 700), (1, 64), (1, 1000)],
    );
}
