//! `minivllm bench machine`: this machine's limits (read bandwidth and the peak of each
//! instruction set the kernels use). They are saved, and `bench latency` and `bench
//! throughput` quote their own figures as a share of them.

use std::path::PathBuf;

use anyhow::Context;
use minivllm::kernels::probe::{self, Limit};
use serde::{Deserialize, Serialize};

#[derive(clap::Args)]
pub struct MachineArgs {
    /// Kernel threads (default: all cores)
    #[arg(long)]
    threads: Option<usize>,
    /// Size of the buffer the bandwidth probe reads: several times the last-level cache
    #[arg(long, default_value = "1GiB", value_parser = crate::parse_bytes)]
    buffer: u64,
    /// Print the results as one JSON object
    #[arg(long)]
    json: bool,
}

/// One limit as saved.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct LimitRecord {
    pub name: String,
    pub unit: String,
    pub one_thread: f64,
    pub all_threads: f64,
    /// The slowest and the median pass on every thread, where measured in passes (the
    /// bandwidth); `all_threads` is the best.
    #[serde(default)]
    pub spread: Option<(f64, f64)>,
}

impl From<Limit> for LimitRecord {
    fn from(l: Limit) -> Self {
        Self {
            name: l.name.into(),
            unit: l.unit.into(),
            one_thread: l.one_thread,
            all_threads: l.all_threads,
            spread: l.spread,
        }
    }
}

/// What `bench machine` measured, saved for the other benchmarks.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct MachineLimits {
    pub cpu: String,
    pub threads: usize,
    /// CPU flags that matter to the kernels (`avx2`, `avx512_vnni`, `amx_tile`, ...).
    pub flags: Vec<String>,
    /// When it was measured (UTC date).
    pub date: String,
    pub limits: Vec<LimitRecord>,
    /// What one parallel kernel pays to fork over the kernel pool and join, in µs: with the
    /// workers awake, and after they slept.
    #[serde(default)]
    pub fork_join_us: Option<(f64, f64)>,
}

impl MachineLimits {
    /// The saved limits, if they were measured on this CPU with this many threads.
    pub fn load(cpu: &str, threads: usize) -> Option<Self> {
        Self::load_from(&cache_path()?, cpu, threads)
    }

    fn load_from(path: &std::path::Path, cpu: &str, threads: usize) -> Option<Self> {
        let text = std::fs::read_to_string(path).ok()?;
        let m: Self = serde_json::from_str(&text).ok()?;
        (m.cpu == cpu && m.threads == threads).then_some(m)
    }

    /// The all-threads figure of the limit called `name`.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.limits
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.all_threads)
    }

    pub fn bandwidth(&self) -> Option<f64> {
        self.get(probe::MEMORY_READ)
    }
}

/// `$XDG_CACHE_HOME/minivllm/machine.json`, or under `~/.cache`.
fn cache_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("minivllm").join("machine.json"))
}

pub fn run(args: MachineArgs) -> anyhow::Result<()> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    minivllm::kernels::threading::init_threads(threads.max(1));
    let env = crate::bench::Environment::now();
    eprintln!(
        "probing read bandwidth over {} MiB, then each instruction set's peak...",
        args.buffer >> 20
    );
    let mut limits = vec![LimitRecord::from(probe::read_bandwidth(
        args.buffer as usize,
    ))];
    limits.extend(probe::compute_peaks().into_iter().map(LimitRecord::from));
    let fj = probe::fork_join();
    let m = MachineLimits {
        cpu: env.cpu.clone(),
        threads: env.threads,
        flags: cpu_flags(),
        date: utc_date(),
        limits,
        fork_join_us: Some((fj.awake_us, fj.asleep_us)),
    };
    let saved = cache_path()
        .context("neither XDG_CACHE_HOME nor HOME is set")
        .and_then(|path| save(&m, path));
    if args.json {
        println!("{}", serde_json::to_string(&m)?);
    } else {
        print_table(&m);
    }
    match saved {
        Ok(path) => eprintln!(
            "saved to {} for `bench latency` and `bench throughput`",
            path.display()
        ),
        Err(e) => eprintln!("warning: limits not saved: {e:#}"),
    }
    Ok(())
}

fn print_table(m: &MachineLimits) {
    println!(
        "{} ({}), {} threads, {}",
        m.cpu,
        m.flags.join(" "),
        m.threads,
        m.date
    );
    println!(
        "{:<26} {:>12} {:>12}",
        "limit",
        "1 thread",
        format!("{} threads", m.threads)
    );
    for l in &m.limits {
        println!(
            "{:<26} {:>12} {:>12}",
            l.name,
            format!("{:.1} {}", l.one_thread, l.unit),
            format!("{:.1} {}", l.all_threads, l.unit)
        );
    }
    for l in &m.limits {
        if let Some((slowest, median)) = l.spread {
            println!(
                "{}: best of passes; slowest {slowest:.1}, median {median:.1} {} on {} threads \
                 (neighbours on a shared machine move it)",
                l.name, l.unit, m.threads
            );
        }
    }
    if let Some((awake, asleep)) = m.fork_join_us {
        println!(
            "kernel pool fork/join: {awake:.1} µs with the workers awake, {asleep:.1} µs after \
             they slept"
        );
    }
    if m.flags.iter().any(|f| f == "amx_tile") {
        println!(
            "(AMX tiles run the quantised products only with MINIVLLM_AMX=1: per block of 32 \
             their float steps bound them, and they measured no faster than AVX512-VNNI)"
        );
    }
}

fn save(m: &MachineLimits, path: PathBuf) -> anyhow::Result<PathBuf> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(m)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The flags of `/proc/cpuinfo` that decide which kernels can run.
fn cpu_flags() -> Vec<String> {
    const WANTED: &[&str] = &[
        "avx2",
        "fma",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "avx_vnni",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
    ];
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split(':').nth(1))
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    WANTED
        .iter()
        .filter(|w| flags.contains(w))
        .map(|w| w.to_string())
        .collect()
}

/// Today's date in UTC, `YYYY-MM-DD`.
fn utc_date() -> String {
    minivllm::engine::chat_template::strftime_now("%Y-%m-%d")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_load_only_for_the_same_cpu_and_threads() {
        let dir = std::env::temp_dir().join(format!("minivllm-machine-{}", std::process::id()));
        let path = dir.join("minivllm").join("machine.json");
        let m = MachineLimits {
            cpu: "Test CPU".into(),
            threads: 2,
            flags: vec!["avx2".into()],
            date: utc_date(),
            limits: vec![LimitRecord {
                name: probe::MEMORY_READ.into(),
                unit: "GB/s".into(),
                one_thread: 10.0,
                all_threads: 15.0,
                spread: Some((11.0, 14.0)),
            }],
            fork_join_us: Some((1.5, 9.0)),
        };
        save(&m, path.clone()).unwrap();
        let load = |cpu, threads| MachineLimits::load_from(&path, cpu, threads);
        let back = load("Test CPU", 2).unwrap();
        assert_eq!(back.bandwidth(), Some(15.0));
        assert_eq!(back.fork_join_us, Some((1.5, 9.0)));
        assert_eq!(back.limits[0].spread, Some((11.0, 14.0)));
        assert!(load("Test CPU", 4).is_none());
        assert!(load("Other CPU", 2).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
