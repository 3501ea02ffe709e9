//! Probes of this machine's limits: memory read bandwidth and the peak rate of each
//! instruction set the kernels use. `minivllm bench machine` prints them, and the other
//! benchmarks quote their own figures as a share of them.
//!
//! Each compute probe runs enough independent chains of one instruction to hide its latency,
//! so it measures throughput; the bandwidth probe sums a buffer far larger than any cache.

use std::hint::black_box;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::threading;

/// Names of the limits that benchmarks look up.
pub const MEMORY_READ: &str = "memory read";
pub const F32_FMA_AVX2: &str = "f32 FMA (AVX2)";
pub const F32_FMA_AVX512: &str = "f32 FMA (AVX-512)";
pub const INT8_AVX2: &str = "int8 dot (AVX2 maddubs)";
pub const INT8_AVX_VNNI: &str = "int8 dot (AVX-VNNI)";
pub const INT8_AVX512_VNNI: &str = "int8 dot (AVX512-VNNI)";
pub const INT8_AMX: &str = "int8 dot (AMX tiles)";

/// A measured limit, on one thread and on every thread of the kernel pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// What was measured, e.g. `"int8 dot (AVX512-VNNI)"`.
    pub name: &'static str,
    /// `"GB/s"`, `"GFLOP/s"` or `"GOP/s"` (int8 multiply-adds count as two operations).
    pub unit: &'static str,
    pub one_thread: f64,
    pub all_threads: f64,
    /// For the bandwidth: the slowest and the median pass on every thread, beside the best
    /// (`all_threads`), which says how far the machine's neighbours moved it.
    pub spread: Option<(f64, f64)>,
}

/// Passes over the buffer per bandwidth figure: on the shared machines this runs on, the
/// read bandwidth moved by half between runs of three passes, so it takes the best of more.
const BANDWIDTH_PASSES: usize = 7;

/// Read bandwidth over a buffer of `bytes` (make it several times the last-level cache):
/// the best of [`BANDWIDTH_PASSES`] passes, each thread summing its own part of the buffer
/// (disjoint, so no two threads share a line).
pub fn read_bandwidth(bytes: usize) -> Limit {
    let buf = vec![1.0f32; bytes / 4];
    let threads = threading::num_threads();
    let gb = (buf.len() * 4) as f64 / 1e9;
    let passes = |run: &dyn Fn()| -> Vec<f64> {
        let mut rates: Vec<f64> = (0..BANDWIDTH_PASSES)
            .map(|_| {
                let t = Instant::now();
                run();
                gb / t.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        rates
    };
    let one = passes(&|| {
        black_box(sum(&buf));
    });
    let part = buf.len().div_ceil(threads);
    let all = passes(&|| {
        threading::install(|| {
            rayon::broadcast(|ctx| {
                let lo = (ctx.index() * part).min(buf.len());
                black_box(sum(&buf[lo..(lo + part).min(buf.len())]));
            })
        });
    });
    Limit {
        name: MEMORY_READ,
        unit: "GB/s",
        one_thread: one[BANDWIDTH_PASSES - 1],
        all_threads: all[BANDWIDTH_PASSES - 1],
        spread: Some((all[0], all[BANDWIDTH_PASSES / 2])),
    }
}

/// What one parallel kernel pays, beyond its own work, to fork over the kernel pool and join
/// again: a decode step runs a few hundred such kernels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForkJoin {
    /// With the other workers awake (kernels in quick succession, as within a step), µs.
    pub awake_us: f64,
    /// After a pause long enough for them to sleep (the first kernel of a step), µs.
    pub asleep_us: f64,
}

/// Measures [`ForkJoin`]: each worker gets a fixed spin of work, and what the parallel call
/// takes beyond it is the cost.
pub fn fork_join() -> ForkJoin {
    const WORK: Duration = Duration::from_micros(10);
    let time = |pause: Duration, calls: usize| {
        threading::install(|| {
            let threads = rayon::current_num_threads();
            let mut total = Duration::ZERO;
            for _ in 0..calls {
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
                let t = Instant::now();
                (0..threads).into_par_iter().for_each(|_| spin(WORK));
                total += t.elapsed();
            }
            (total / calls as u32).saturating_sub(WORK).as_secs_f64() * 1e6
        })
    };
    ForkJoin {
        awake_us: time(Duration::ZERO, 5000),
        asleep_us: time(Duration::from_millis(2), 300),
    }
}

/// Busy-waits for `d`: the work a fork/join probe gives each thread.
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// The peak of every compute probe this CPU supports.
pub fn compute_peaks() -> Vec<Limit> {
    PROBES
        .iter()
        .filter(|p| (p.available)())
        .map(|p| {
            // Calibrate to about 0.1 s per thread, then time one thread and all of them.
            let mut iters = 1 << 16;
            loop {
                let t = Instant::now();
                black_box((p.run)(iters));
                if t.elapsed().as_secs_f64() > 0.05 || iters > 1 << 30 {
                    break;
                }
                iters *= 2;
            }
            let ops = (iters * p.ops_per_iter) as f64;
            let t = Instant::now();
            black_box((p.run)(iters));
            let one = ops / t.elapsed().as_secs_f64() / 1e9;
            let t = Instant::now();
            let threads = threading::install(|| {
                rayon::broadcast(|_| black_box((p.run)(iters)));
                rayon::current_num_threads()
            });
            let all = ops * threads as f64 / t.elapsed().as_secs_f64() / 1e9;
            Limit {
                name: p.name,
                unit: p.unit,
                one_thread: one,
                all_threads: all,
                spread: None,
            }
        })
        .collect()
}

struct Probe {
    name: &'static str,
    unit: &'static str,
    available: fn() -> bool,
    /// Runs `iters` iterations; the result only keeps the work from being optimised away.
    run: fn(usize) -> f32,
    ops_per_iter: usize,
}

/// Independent accumulator chains per probe: more than latency × throughput of any of these
/// instructions on current cores, and few enough to stay in registers.
const CHAINS: usize = 12;

#[cfg(target_arch = "x86_64")]
const PROBES: &[Probe] = &[
    Probe {
        name: F32_FMA_AVX2,
        unit: "GFLOP/s",
        available: || std::arch::is_x86_feature_detected!("fma"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::fma_avx2(n) },
        ops_per_iter: CHAINS * 8 * 2,
    },
    Probe {
        name: F32_FMA_AVX512,
        unit: "GFLOP/s",
        available: || std::arch::is_x86_feature_detected!("avx512f"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::fma_avx512(n) },
        ops_per_iter: CHAINS * 16 * 2,
    },
    Probe {
        name: INT8_AVX2,
        unit: "GOP/s",
        available: || std::arch::is_x86_feature_detected!("avx2"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::int8_avx2(n) },
        ops_per_iter: x86::INT8_AVX2_CHAINS * x86::INT8_AVX2_PRODUCTS * 32 * 2,
    },
    Probe {
        name: INT8_AVX_VNNI,
        unit: "GOP/s",
        available: || std::arch::is_x86_feature_detected!("avxvnni"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::int8_avxvnni(n) },
        ops_per_iter: CHAINS * 32 * 2,
    },
    Probe {
        name: INT8_AVX512_VNNI,
        unit: "GOP/s",
        available: || std::arch::is_x86_feature_detected!("avx512vnni"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::int8_avx512vnni(n) },
        ops_per_iter: CHAINS * 64 * 2,
    },
    Probe {
        name: INT8_AMX,
        unit: "GOP/s",
        available: crate::amx::available,
        // SAFETY: `available` checked that the CPU has AMX-INT8 and the process its state.
        run: |n| unsafe { x86::int8_amx(n) },
        ops_per_iter: 4 * 16 * 16 * 64 * 2,
    },
    Probe {
        name: "bf16 dot (AVX512-BF16)",
        unit: "GFLOP/s",
        available: || std::arch::is_x86_feature_detected!("avx512bf16"),
        // SAFETY: `available` checked that the CPU has these instructions.
        run: |n| unsafe { x86::bf16_avx512(n) },
        ops_per_iter: CHAINS * 32 * 2,
    },
];

#[cfg(not(target_arch = "x86_64"))]
const PROBES: &[Probe] = &[];

/// `Σ x`, in 16 independent lanes so it streams at load throughput.
fn sum(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was just detected.
        return unsafe { x86::sum_avx2(x) };
    }
    sum_lanes(x)
}

#[inline(always)]
fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::CHAINS;
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// Chains of the AVX2 int8 dot as the 4-bit tiles run it: fewer than `CHAINS`, as
    /// each has [`INT8_AVX2_PRODUCTS`] products in flight.
    pub(super) const INT8_AVX2_CHAINS: usize = 4;
    /// `vpmaddubsw` products summed in 16 bits per `vpmaddwd` widening, as the tiles sum
    /// 4-bit quants' products (`tiles::tile_nibbles`). A widening per product, as a probe
    /// once had it, halved the figure on a Zen 1 EPYC, whose one integer multiply pipe
    /// takes both instructions: the tiles then ran at "99 % of the peak".
    pub(super) const INT8_AVX2_PRODUCTS: usize = 8;

    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn sum_avx2(x: &[f32]) -> f32 {
        super::sum_lanes(x)
    }

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma_avx2(n: usize) -> f32 {
        let (a, b) = (
            _mm256_set1_ps(black_box(0.999)),
            _mm256_set1_ps(black_box(1e-3)),
        );
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        for _ in 0..n {
            for x in &mut acc {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe {
            _mm256_storeu_ps(
                out.as_mut_ptr(),
                acc.iter().fold(a, |s, &v| _mm256_add_ps(s, v)),
            )
        };
        out.iter().sum()
    }

    /// # Safety
    /// AVX-512F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma_avx512(n: usize) -> f32 {
        let (a, b) = (
            _mm512_set1_ps(black_box(0.999)),
            _mm512_set1_ps(black_box(1e-3)),
        );
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..n {
            for x in &mut acc {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        _mm512_reduce_add_ps(acc.iter().fold(a, |s, &v| _mm512_add_ps(s, v)))
    }

    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn int8_avx2(n: usize) -> f32 {
        // The products do not depend on the accumulators, so their inputs change every
        // iteration (16 vectors cycled from L1) and differ per chain: otherwise the compiler
        // hoists them out of the loop and this times additions alone.
        let us: [__m256i; 16] = black_box(std::array::from_fn(|i| _mm256_set1_epi8(i as i8 + 1)));
        let ss: [__m256i; INT8_AVX2_CHAINS] =
            black_box(std::array::from_fn(|c| _mm256_set1_epi8(-(c as i8) - 1)));
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_si256(); INT8_AVX2_CHAINS];
        for i in 0..n {
            for (x, &s) in acc.iter_mut().zip(&ss) {
                let mut s16 = _mm256_maddubs_epi16(us[i & 15], s);
                for t in 1..INT8_AVX2_PRODUCTS {
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(us[(i + t) & 15], s));
                }
                *x = _mm256_add_epi32(*x, _mm256_madd_epi16(s16, ones));
            }
        }
        let total = acc.iter().fold(ones, |s, &v| _mm256_add_epi32(s, v));
        _mm256_extract_epi32::<0>(total) as f32
    }

    /// # Safety
    /// AVX-VNNI must be available.
    #[target_feature(enable = "avxvnni")]
    pub(super) unsafe fn int8_avxvnni(n: usize) -> f32 {
        let u = _mm256_set1_epi8(black_box(3));
        let s = _mm256_set1_epi8(black_box(-2));
        let mut acc = [_mm256_setzero_si256(); CHAINS];
        for _ in 0..n {
            for x in &mut acc {
                *x = _mm256_dpbusd_avx_epi32(*x, u, s);
            }
        }
        let total = acc.iter().fold(u, |s, &v| _mm256_add_epi32(s, v));
        _mm256_extract_epi32::<0>(total) as f32
    }

    /// # Safety
    /// AVX-512F and AVX512-VNNI must be available.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn int8_avx512vnni(n: usize) -> f32 {
        let u = _mm512_set1_epi8(black_box(3));
        let s = _mm512_set1_epi8(black_box(-2));
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        for _ in 0..n {
            for x in &mut acc {
                *x = _mm512_dpbusd_epi32(*x, u, s);
            }
        }
        _mm512_reduce_add_epi32(acc.iter().fold(u, |s, &v| _mm512_add_epi32(s, v))) as f32
    }

    /// Four independent sums tiles, each `tdpbssd` a full 16 × 16 × 64 product: the 2 × 2
    /// blocking a GEMM runs its tiles in.
    ///
    /// # Safety
    /// [`crate::amx::available`] must be true.
    pub(super) unsafe fn int8_amx(n: usize) -> f32 {
        use crate::amx::{self, TileConfig};
        #[repr(C, align(64))]
        struct Tile([u8; 1024]);
        let cfg = (0..8).fold(TileConfig::new(), |c, t| c.tile(t, 16, 64));
        let src = Tile(black_box([3; 1024]));
        let mut out = Tile([0; 1024]);
        // SAFETY: the caller's contract; every tile is configured as 16 rows of 64 bytes,
        // which `src` and `out` hold.
        unsafe {
            amx::configure(&cfg);
            amx::load::<4>(src.0.as_ptr(), 64);
            amx::load::<5>(src.0.as_ptr(), 64);
            amx::load::<6>(src.0.as_ptr(), 64);
            amx::load::<7>(src.0.as_ptr(), 64);
            for _ in 0..n {
                amx::dot_ss::<0, 4, 6>();
                amx::dot_ss::<1, 4, 7>();
                amx::dot_ss::<2, 5, 6>();
                amx::dot_ss::<3, 5, 7>();
            }
            amx::store::<0>(out.0.as_mut_ptr(), 64);
            amx::release();
        }
        out.0[0] as f32
    }

    /// # Safety
    /// AVX-512F and AVX512-BF16 must be available.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn bf16_avx512(n: usize) -> f32 {
        let a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(black_box(0.5)), _mm512_set1_ps(0.25));
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        for _ in 0..n {
            for x in &mut acc {
                *x = _mm512_dpbf16_ps(*x, a, a);
            }
        }
        _mm512_reduce_add_ps(
            acc.iter()
                .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_match_plain_loop() {
        let x: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let want: f32 = x.iter().sum();
        assert_eq!(sum_lanes(&x), want);
        assert_eq!(sum(&x), want);
    }

    #[test]
    fn probes_report_positive_rates_for_this_cpu() {
        let bw = read_bandwidth(8 << 20);
        assert!(bw.one_thread > 0.0 && bw.all_threads > 0.0, "{bw:?}");
        let (slowest, median) = bw.spread.expect("the bandwidth has a spread");
        assert!(
            0.0 < slowest && slowest <= median && median <= bw.all_threads,
            "{bw:?}"
        );
        let peaks = compute_peaks();
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("fma") {
            assert!(peaks.iter().any(|p| p.name == F32_FMA_AVX2));
        }
        for p in &peaks {
            assert!(p.one_thread > 0.0 && p.all_threads.is_finite(), "{p:?}");
            eprintln!("probe ran: {} {:.1} {}", p.name, p.one_thread, p.unit);
        }
        for p in PROBES.iter().filter(|p| !(p.available)()) {
            eprintln!("SKIPPED probe {}: not on this CPU", p.name);
        }
    }
}
