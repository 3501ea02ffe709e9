//! Tensor parallelism across processes: `mpirun -n 3 minivllm ... --tensor-parallel-size 3`
//! gives the tokens one process gives, on the default quantised path (SmolLM2-135M, and
//! the real Qwen2.5 and Gemma 3 files where they are downloaded, whose heads do not split
//! by 3), its ranks stop together when rank 0 stops, and the death of any rank ends the
//! job within seconds. Needs the `mpi` feature and Open MPI's `mpirun`; without them each
//! test says it was skipped.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use minivllm::testing::{real_model, skip_or_fail};
use serde_json::{json, Value};

use crate::common::model;
use crate::server::{request, start_ranks, Server};

const PROMPTS: [&str; 12] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "List three colours:",
    "The three laws of thermodynamics are",
    "SELECT name FROM users WHERE",
    "In 1969, the first person to walk on the Moon",
    "Here is a haiku about autumn:",
    "To make bread, you need",
    "The difference between a list and a tuple in Python is",
    "Question: What is 12 times 12? Answer:",
    "Dear Sir or Madam,",
];

/// Whether the MPI tests can run here: where they cannot, a failure, or `false` (after
/// saying so) where the developer opted out with `MINIVLLM_SKIP=mpi`.
fn mpi_available(test: &str) -> bool {
    let mpirun = Command::new("mpirun").arg("--version").output();
    let ok = cfg!(feature = "mpi") && mpirun.is_ok_and(|o| o.status.success());
    if !ok {
        skip_or_fail(
            "mpi",
            test,
            "needs `--features mpi` (scripts/mpi_features.sh) and Open MPI's mpirun \
             (apt-get install openmpi-bin libopenmpi-dev libclang-dev)",
        );
    }
    ok
}

fn mpirun(ranks: usize) -> Command {
    let mut c = Command::new("timeout");
    c.args([
        "300",
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
    ])
    .arg(ranks.to_string())
    .arg(env!("CARGO_BIN_EXE_minivllm"));
    c
}

/// Greedy completions of `PROMPTS` in one batch on the default path (EOS ignored, so that
/// every prompt runs the whole length), as `[prompt][token]`.
fn generate(launcher: Command, ranks: usize) -> Vec<Vec<u64>> {
    generate_with(launcher, ranks, &model(), &PROMPTS, 24, &[])
}

fn generate_with(
    launcher: Command,
    ranks: usize,
    model: &str,
    prompts: &[&str],
    max_tokens: usize,
    extra: &[&str],
) -> Vec<Vec<u64>> {
    let mut cmd = launcher;
    cmd.args(["generate", "--model", model])
        .args([
            "--tensor-parallel-size",
            &ranks.to_string(),
            "--threads",
            "1",
        ])
        .args(["--max-tokens", &max_tokens.to_string()])
        .args(["--temperature", "0", "--ignore-eos", "--json"])
        .args(extra);
    for p in prompts {
        cmd.args(["--prompt", p]);
    }
    let out = cmd.output().expect("run minivllm generate");
    assert!(out.status.success(), "{ranks} ranks: {}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("one JSON output per line");
            let ids = v["outputs"][0]["token_ids"].as_array().expect("token ids");
            ids.iter().map(|t| t.as_u64().expect("id")).collect()
        })
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn generate_on_three_ranks_gives_one_process_tokens() {
    if !mpi_available("generate_on_three_ranks_gives_one_process_tokens") {
        return;
    }
    let alone = generate(Command::new(env!("CARGO_BIN_EXE_minivllm")), 1);
    assert_eq!(alone.len(), PROMPTS.len());
    assert!(alone.iter().all(|ids| ids.len() == 24));
    assert_eq!(generate(mpirun(3), 3), alone);
}

/// The real Qwen2.5-Coder-0.5B (14 heads, 2 KV heads, 151,936 tokens) and Gemma 3 270M
/// (4 heads, 1 KV head) files, Q4_K_M, give one process's tokens at 2 and 3 ranks: at 3
/// their heads do not split, so every rank computes all of them, and every other width
/// splits unevenly.
/// Speculative decoding is rank 0's: its proposer (n-gram lookup, or a draft model loaded
/// whole on rank 0) guesses, the group verifies. On two ranks, one process's plain tokens.
#[test]
fn speculation_on_two_ranks_gives_one_process_plain_tokens() {
    if !mpi_available("speculation_on_two_ranks_gives_one_process_plain_tokens") {
        return;
    }
    let alone = generate(Command::new(env!("CARGO_BIN_EXE_minivllm")), 1);
    let ngram = r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1, "adaptive_draft_length": false}"#;
    let draft = format!(
        r#"{{"method": "draft_model", "model": {:?}, "num_speculative_tokens": 3, "adaptive_draft_length": false}}"#,
        model()
    );
    for spec in [ngram, &draft] {
        let extra = ["--speculative-config", spec];
        let got = generate_with(mpirun(2), 2, &model(), &PROMPTS, 24, &extra);
        assert_eq!(got, alone, "{spec}");
    }
}

#[test]
fn real_files_on_two_and_three_ranks_give_one_process_tokens() {
    let test = "real_files_on_two_and_three_ranks_give_one_process_tokens";
    if !mpi_available(test) {
        return;
    }
    for (file, name) in [
        (
            "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            "qwen2.5-coder-0.5b",
        ),
        ("gemma-3-270m.Q4_K_M.gguf", "gemma-3-270m"),
    ] {
        let Some(path) = real_model(file, name, test) else {
            continue;
        };
        let path = path.to_str().unwrap();
        let prompts = &PROMPTS[..4];
        let alone = generate_with(
            Command::new(env!("CARGO_BIN_EXE_minivllm")),
            1,
            path,
            prompts,
            16,
            &[],
        );
        assert!(alone.iter().all(|ids| ids.len() == 16), "{file}");
        for ranks in [2, 3] {
            let split = generate_with(mpirun(ranks), ranks, path, prompts, 16, &[]);
            assert_eq!(split, alone, "{file} on {ranks} ranks");
        }
    }
}

#[test]
fn a_world_that_does_not_match_is_refused_at_start() {
    if !mpi_available("a_world_that_does_not_match_is_refused_at_start") {
        return;
    }
    let run = |ranks: usize, tp: &str| {
        let out = mpirun(ranks)
            .args(["generate", "--model", &model(), "--prompt", "Hi"])
            .args(["--tensor-parallel-size", tp, "--threads", "1"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        stderr(&out)
    };
    let err = run(2, "3");
    assert!(
        err.contains("started 2 processes but --tensor-parallel-size is 3"),
        "{err}"
    );
}

/// The completion one process gives, through `generate`.
fn one_process_completion(prompt: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_minivllm"))
        .args(["generate", "--model", &model(), "--prompt", prompt])
        .args(["--max-tokens", "16", "--temperature", "0", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["outputs"][0]["text"].as_str().unwrap().to_string()
}

/// Waits for `server`'s mpirun to exit, for at most `within`.
fn exit_status(server: &mut Server, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = server.child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The process of `rank` among mpirun's children (Open MPI starts a host's ranks itself
/// and tells each its rank in `OMPI_COMM_WORLD_RANK`).
fn rank_pid(mpirun: u32, rank: usize) -> u32 {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    for entry in std::fs::read_dir("/proc").unwrap().map_while(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent's pid is the second field after the parenthesised command name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(mpirun) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.split(|&b| b == 0).any(|var| var == want.as_bytes()) {
            return pid;
        }
    }
    panic!("no process of rank {rank} under mpirun {mpirun}");
}

/// Whether `pid` runs (an exited process may linger as a zombie until it is reaped).
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state.is_some_and(|s| s != "Z" && s != "X")
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

/// The OpenAI-compatible server on three ranks answers as one process does, and when rank 0
/// is stopped every rank exits cleanly.
#[test]
fn serve_on_three_ranks_answers_and_stops_together() {
    if !mpi_available("serve_on_three_ranks_answers_and_stops_together") {
        return;
    }
    let prompt = PROMPTS[0];
    let mut server = start_ranks(3, &model(), &[]);
    let body = json!({"model": "smol", "prompt": prompt, "max_tokens": 16, "temperature": 0});
    let (status, reply) = request(
        server.port,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
    )
    .expect("completion request");
    assert_eq!(status, 200, "{reply}");
    let reply: Value = serde_json::from_str(&reply).unwrap();
    let text = reply["choices"][0]["text"].as_str().unwrap();
    // Q4_1 weights: the sums' order may move a near-tie, but not on this prompt.
    assert_eq!(text, one_process_completion(prompt));
    signal(rank_pid(server.child.id(), 0), "-TERM");
    let status = exit_status(&mut server, Duration::from_secs(30)).expect("ranks still running");
    assert!(status.success(), "mpirun: {status}");
}

/// Killing any one rank (a worker, or the driver) ends the whole job within seconds, with
/// an error: no rank is left waiting in a collective.
#[test]
fn a_killed_rank_ends_the_job_within_seconds() {
    if !mpi_available("a_killed_rank_ends_the_job_within_seconds") {
        return;
    }
    for victim in [2, 0] {
        let mut server = start_ranks(3, &model(), &[]);
        let others: Vec<u32> = (0..3)
            .filter(|&r| r != victim)
            .map(|r| rank_pid(server.child.id(), r))
            .collect();
        signal(rank_pid(server.child.id(), victim), "-KILL");
        let killed = Instant::now();
        let status = exit_status(&mut server, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("rank {victim} killed: the job still runs after 10 s"));
        assert!(!status.success(), "rank {victim} killed: mpirun {status}");
        // mpirun may return while the SIGKILLed ranks are still being torn down (their
        // memory unmapped), which takes a moment on a loaded machine: the bound is the
        // same 10 s from the kill.
        for pid in others {
            while alive(pid) && killed.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                !alive(pid),
                "rank {victim} killed: process {pid} still runs 10 s later"
            );
        }
        eprintln!(
            "rank {victim} killed: the job ended in {:?}",
            killed.elapsed()
        );
    }
}

/// Two "hosts" on this machine: network namespaces joined by a veth pair, with their own
/// addresses on a /24 of their own. Removed (with the link) when dropped.
struct TwoHosts {
    names: [String; 2],
    addrs: [String; 2],
    subnet: String,
}

impl TwoHosts {
    /// `None` where namespaces cannot be made here (not root, no iproute2, no permission).
    fn new() -> Option<Self> {
        let id = std::process::id();
        let names = [format!("mvtp{id}a"), format!("mvtp{id}b")];
        let net = format!("10.{}.{}", 100 + (id >> 8) % 100, id % 256);
        let hosts = Self {
            addrs: [format!("{net}.1"), format!("{net}.2")],
            subnet: format!("{net}.0/24"),
            names,
        };
        let [a, b] = &hosts.names;
        let (va, vb) = (format!("{a}v"), format!("{b}v"));
        let steps: [&[&str]; 11] = [
            &["netns", "add", a],
            &["netns", "add", b],
            &["link", "add", &va, "type", "veth", "peer", "name", &vb],
            &["link", "set", &va, "netns", a],
            &["link", "set", &vb, "netns", b],
            &[
                "-n",
                a,
                "addr",
                "add",
                &format!("{}/24", hosts.addrs[0]),
                "dev",
                &va,
            ],
            &[
                "-n",
                b,
                "addr",
                "add",
                &format!("{}/24", hosts.addrs[1]),
                "dev",
                &vb,
            ],
            &["-n", a, "link", "set", &va, "up"],
            &["-n", b, "link", "set", &vb, "up"],
            &["-n", a, "link", "set", "lo", "up"],
            &["-n", b, "link", "set", "lo", "up"],
        ];
        for step in steps {
            let out = Command::new("ip").args(step).output().ok()?;
            if !out.status.success() {
                eprintln!("ip {}: {}", step.join(" "), stderr(&out).trim());
                return None;
            }
        }
        Some(hosts)
    }

    /// Bytes received on the second host's end of the link.
    fn received_by_second(&self) -> u64 {
        let b = &self.names[1];
        let out = Command::new("ip")
            .args(["netns", "exec", b, "cat"])
            .arg(format!("/sys/class/net/{b}v/statistics/rx_bytes"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// The ranks on two "hosts" (network namespaces joined by a veth pair): mpirun starts in the
/// first, and reaches the second through a remote-shell agent that enters its namespace (as
/// ssh would enter another machine); the collectives are held to that link by address.
/// Ranks 0 and 1 run on the first host, rank 2 on the second.
#[test]
fn ranks_on_two_hosts_over_tcp_give_one_process_tokens() {
    let test = "ranks_on_two_hosts_over_tcp_give_one_process_tokens";
    if !mpi_available(test) {
        return;
    }
    let Some(hosts) = TwoHosts::new() else {
        let missing = "this machine cannot create network namespaces (needs root and iproute2)";
        return skip_or_fail("netns", test, missing);
    };
    let dir = tempfile::tempdir().unwrap();
    let agent = dir.path().join("netns-agent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/bin/sh\n# mpirun's remote shell: runs the command on host $1 (its namespace).\n\
             shift\nexec ip netns exec {} unshare --uts sh -c \"hostname second-host; $*\"\n",
            hosts.names[1]
        ),
    )
    .unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut launcher = Command::new("timeout");
    launcher
        .args(["300", "ip", "netns", "exec", &hosts.names[0], "mpirun"])
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "3",
            "--host",
        ])
        .arg(format!("{}:2,{}:1", hosts.addrs[0], hosts.addrs[1]))
        .args(["--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--mca", "btl", "tcp,self"])
        .args(["--mca", "btl_tcp_if_include", &hosts.subnet])
        .args(["--mca", "oob_tcp_if_include", &hosts.subnet])
        .arg(env!("CARGO_BIN_EXE_minivllm"));
    let before = hosts.received_by_second();
    let split = generate(launcher, 3);
    let crossed = hosts.received_by_second() - before;
    assert_eq!(
        split,
        generate(Command::new(env!("CARGO_BIN_EXE_minivllm")), 1)
    );
    eprintln!("{test}: {crossed} bytes reached the second host over the link");
    // 24 steps, in each of which each of the 30 layers gathers at least two 576-wide rows
    // of which the other ranks hold two thirds; the weights' load needs none: the traffic
    // is the collectives'.
    assert!(
        crossed > 24 * 30 * 2 * 384 * 4,
        "only {crossed} bytes crossed the link"
    );
}
