//! `minivllm bench serve` end to end, against a real `minivllm serve` on a loopback port.

use std::process::{Command, Output};

use serde_json::Value;

use crate::common;
use crate::server;
use common::model;
use server::start;

/// A port nothing listens on (free when this returns).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn bench_serve(base_url: &str, extra: &[&str]) -> Output {
    let tokenizer = model();
    let mut args = vec![
        "bench",
        "serve",
        "--base-url",
        base_url,
        "--tokenizer",
        &tokenizer,
        "--random-input-len",
        "32",
        "--random-output-len",
        "8",
        "--json",
    ];
    args.extend_from_slice(extra);
    Command::new(env!("CARGO_BIN_EXE_minivllm"))
        .args(&args)
        .output()
        .expect("run minivllm bench serve")
}

/// The JSON result of a run that must have succeeded.
fn result(out: &Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout:?} {stderr}"))
}

#[test]
fn bench_serve_against_minivllm_serve() {
    let server = start(&model());
    let url = format!("http://127.0.0.1:{}", server.port);

    let r = result(&bench_serve(
        &url,
        &["--num-prompts", "8", "--max-concurrency", "4"],
    ));
    assert_eq!(r["completed"], 8, "{r}");
    assert_eq!(r["failed"], 0, "{r}");
    // ignore_eos: every request generates exactly --random-output-len tokens.
    assert_eq!(r["total_output_tokens"], 64, "{r}");
    // The prompt builder hits the length exactly, as the server's usage counts it.
    assert_eq!(r["total_input_tokens"], 8 * 32, "{r}");
    assert_eq!(r["max_concurrency"], 4);
    assert_eq!(r["model_id"], "smol");
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {r}"));
    assert!(f("mean_ttft_ms") > 0.0, "{r}");
    assert!(f("p99_ttft_ms") >= f("median_ttft_ms"), "{r}");
    assert!(f("mean_itl_ms") > 0.0 && f("mean_tpot_ms") > 0.0, "{r}");
    assert!(f("mean_e2el_ms") >= f("mean_ttft_ms"), "{r}");
    assert!(f("output_throughput") > 0.0, "{r}");

    let r = result(&bench_serve(
        &url,
        &[
            "--num-prompts",
            "4",
            "--request-rate",
            "20",
            "--endpoint",
            "/v1/chat/completions",
        ],
    ));
    assert_eq!(
        (r["completed"].clone(), r["failed"].clone()),
        (4.into(), 0.into()),
        "{r}"
    );
    assert_eq!(r["total_output_tokens"], 32, "{r}");
    assert_eq!(r["request_rate"], 20.0);

    // jsonl prompts are reused in order when there are fewer than --num-prompts.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    std::fs::write(
        &file,
        "{\"prompt\": \"The capital of France is\", \"output_len\": 2}\n\n{\"prompt\": \"def f(n):\"}\n",
    )
    .unwrap();
    let r = result(&bench_serve(
        &url,
        &[
            "--dataset-name",
            "jsonl",
            "--dataset-path",
            file.to_str().unwrap(),
            "--num-prompts",
            "3",
        ],
    ));
    assert_eq!(r["completed"], 3, "{r}");
    // 2 + --random-output-len 8 + 2
    assert_eq!(r["total_output_tokens"], 12, "{r}");
}

#[test]
fn bench_serve_without_a_server_says_so() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = bench_serve(&url, &["--num-prompts", "2"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the server at {url}")),
        "{stderr}"
    );
}
