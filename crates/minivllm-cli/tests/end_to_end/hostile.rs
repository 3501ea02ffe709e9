//! Requests an attacker would send, each within the documented limits, against a server
//! under a 2 GiB address-space cap: every one gets a 4xx naming its limit or succeeds within
//! its memory budget, the server survives them all, other clients' greedy requests keep
//! getting their answers meanwhile, and the memory goes back once the burst is over.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common;
use crate::server;
use common::{model, StopOnDrop};
use server::{request, request_with, rss_kib, start_capped, start_with, Server};

const CAP: u64 = 2 << 30;

fn post(server: &Server, body: &Value) -> (u16, Value) {
    post_to(server, "/v1/completions", body)
}

fn post_to(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:.300}"));
    (status, v)
}

fn greedy(server: &Server) -> String {
    let (status, v) = post(
        server,
        &json!({"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Another client's greedy requests, until `done`: each must keep its answer. Returns the
/// slowest one's time.
fn bystander(server: &Server, answer: &str, done: &AtomicBool) -> Duration {
    let mut slowest = Duration::ZERO;
    while !done.load(Ordering::Relaxed) {
        let t = Instant::now();
        assert_eq!(greedy(server), answer);
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    slowest
}

/// The probe's crashing requests, and the bounds each must meet: the status it may get and
/// a word its error message must hold.
fn hostile_requests() -> Vec<(&'static str, Value, &'static [u16], &'static str)> {
    let stops: Vec<String> = (0..1024)
        .map(|i| format!("{i:04}{}", "s".repeat(4092)))
        .collect();
    vec![
        (
            "24 prompts x 1,024 stop strings of 4 KiB",
            json!({"prompt": vec![vec![1]; 24], "stop": stops, "max_tokens": 2}),
            &[200, 400],
            "--max-request-memory",
        ),
        (
            "n 256 x logprobs 20 x an echoed 800-token prompt",
            json!({"prompt": (100..900).collect::<Vec<u32>>(), "n": 256, "logprobs": 20,
                   "echo": true, "max_tokens": 1, "temperature": 1}),
            &[400],
            "--max-request-memory",
        ),
        (
            "1.5 M stop_token_ids",
            json!({"prompt": vec![vec![1]; 200], "stop_token_ids": vec![5; 1_500_000]}),
            &[400],
            "stop_token_ids",
        ),
        (
            "logit_bias over the whole vocabulary x 200 prompts",
            json!({"prompt": vec![vec![1]; 200], "max_tokens": 2,
                   "logit_bias": (0..49152).map(|i| (i.to_string(), json!(1))).collect::<serde_json::Map<_, _>>()}),
            &[200, 400],
            "--max-request-memory",
        ),
        (
            "2 prompts x n 256",
            json!({"prompt": ["a", "b"], "n": 256}),
            &[400],
            "--max-num-seqs",
        ),
        (
            "3,000 prompts",
            json!({"prompt": vec!["a"; 3000]}),
            &[400],
            "--max-num-seqs",
        ),
        (
            "logprobs -1 (the whole vocabulary)",
            json!({"prompt": "hi", "logprobs": -1}),
            &[400],
            "Requested sample logprobs of 49152, which is greater than max allowed: 20",
        ),
        (
            "a 7.8 MB prompt (the tokenizer's working memory)",
            json!({"prompt": "a ".repeat(3_900_000), "max_tokens": 1}),
            &[400],
            "--max-request-memory",
        ),
        (
            "prompt_logprobs 100000",
            json!({"prompt": "hi", "prompt_logprobs": 100000}),
            &[400],
            "max allowed: 20",
        ),
    ]
}

#[cfg(target_os = "linux")]
#[test]
fn hostile_requests_under_a_2_gib_cap_get_4xx_and_the_memory_goes_back() {
    let server = start_capped(&model(), CAP, &["--max-num-seqs", "256"]);
    let answer = greedy(&server);
    for _ in 0..3 {
        greedy(&server);
    }
    let (warm, warm_kv) = memory(&server);
    let done = AtomicBool::new(false);
    let (slowest_hostile, slowest) = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&done);
        let watch = scope.spawn(|| bystander(&server, &answer, &done));
        for (what, body, allowed, names) in hostile_requests() {
            let (status, v) = post(&server, &body);
            assert!(allowed.contains(&status), "{what}: {status} {v:.300}");
            if status != 200 {
                let msg = v["error"]["message"].as_str().unwrap_or_default();
                assert!(msg.contains(names), "{what}: {msg}");
            }
            eprintln!("{what}: {status}, RSS {} KiB", rss_kib(&server));
        }
        done.store(true, Ordering::Relaxed);
        let slowest_hostile = watch.join().unwrap();
        // Large requests the budget admits: their memory must be given back afterwards.
        // (Each is one 300-token prefill step that a bystander waits behind: > 1 s on two
        // cores, a matter for the scheduler's chunking, not for the memory bounds.)
        done.store(false, Ordering::Relaxed);
        let watch = scope.spawn(|| bystander(&server, &answer, &done));
        for _ in 0..3 {
            let body = json!({"prompt": (100..400).collect::<Vec<u32>>(), "n": 8,
                              "logprobs": 20, "echo": true, "max_tokens": 4, "temperature": 1});
            let (status, v) = post(&server, &body);
            assert_eq!(status, 200, "{v:.300}");
            assert_eq!(v["choices"].as_array().unwrap().len(), 8);
        }
        done.store(true, Ordering::Relaxed);
        (slowest_hostile, watch.join().unwrap())
    });
    // Printed, not asserted: a timing, which other tests sharing the cores would upset.
    eprintln!(
        "the bystander's slowest greedy request: {slowest_hostile:?} during the hostile \
         requests, {slowest:?} behind the large admitted ones"
    );
    assert_eq!(greedy(&server), answer);
    // Back within 20 % of warm idle plus the KV cache pages written since (resident from
    // then on) within 10 s of the burst, both as /metrics reports them. Measured here: 143
    // MB warm, 158-161 MB after; 1.4x without `map_large_allocations`, 1.6x without the
    // trims.
    let deadline = Instant::now() + Duration::from_secs(10);
    let bound = |kv: f64| warm * 1.2 + (kv - warm_kv);
    let (mut now, mut kv) = memory(&server);
    while now > bound(kv) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        (now, kv) = memory(&server);
    }
    let mib = |b: f64| b / f64::from(1 << 20);
    eprintln!(
        "RSS: {:.0} MiB warm ({:.1} MiB of KV cache written), {:.0} MiB after the burst ({:.1} \
         MiB)",
        mib(warm),
        mib(warm_kv),
        mib(now),
        mib(kv)
    );
    assert!(
        now <= bound(kv),
        "RSS {now} 10 s after the burst, {warm} warm, KV cache written {warm_kv} -> {kv}"
    );
    // /metrics reports the process's own resident size.
    let proc = rss_kib(&server) as f64 * 1024.0;
    assert!(
        (now - proc).abs() < 0.2 * proc,
        "{now} in /metrics, {proc} in /proc"
    );
}

/// The server's resident memory and the bytes of its KV cache written so far, from
/// `/metrics` (Prometheus' `process_resident_memory_bytes`, `minivllm:kv_cache_touched_bytes`).
fn memory(server: &Server) -> (f64, f64) {
    let text = server::metrics(server);
    let rss = text
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no process_resident_memory_bytes in {text}"));
    (
        rss,
        server::metric(&text, "minivllm:kv_cache_touched_bytes", ""),
    )
}

/// vLLM's answers where the first probe found us differing: seeds are any i64, priority
/// needs the priority policy, prompt_logprobs come back, and continue_final_message leaves
/// the assistant's turn open.
#[test]
fn vllm_behaviour_for_seeds_priority_prompt_logprobs_and_prefill() {
    let server = start_with(&model(), &[]);
    let (status, v) = post(
        &server,
        &json!({"prompt": "hi", "seed": -1, "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(
        &server,
        &json!({"prompt": "hi", "seed": u64::MAX, "max_tokens": 2}),
    );
    assert_eq!(status, 400, "{v}");
    let (status, v) = post(&server, &json!({"prompt": "hi", "priority": 3}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "priority");
    let (status, v) = post(
        &server,
        &json!({"prompt": "The capital of France is", "prompt_logprobs": 2, "max_tokens": 1}),
    );
    assert_eq!(status, 200, "{v}");
    let plp = v["choices"][0]["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        plp.len(),
        v["usage"]["prompt_tokens"].as_u64().unwrap() as usize
    );
    assert!(plp[0].is_null());
    let second = plp[1].as_object().unwrap();
    assert!(second.len() >= 2 && second.len() <= 3, "{second:?}");
    assert!(second
        .values()
        .all(|e| e["logprob"].as_f64().unwrap() <= 0.0));

    let chat = |body: Value| post_to(&server, "/v1/chat/completions", &body);
    let messages = json!([{"role": "user", "content": "Name a colour."},
                          {"role": "assistant", "content": "My favourite colour is"}]);
    let (status, v) = chat(json!({"messages": messages, "continue_final_message": true}));
    assert_eq!(status, 400, "both flags: {v}");
    let (status, v) = chat(json!({"messages": messages, "continue_final_message": true,
                                  "add_generation_prompt": false, "max_tokens": 1}));
    assert_eq!(status, 200, "{v}");
    let body = json!({"messages": messages, "continue_final_message": true,
                      "add_generation_prompt": false, "return_token_strs": true});
    let (_, tokenized) = post_to(&server, "/tokenize", &body);
    let strs: Vec<&str> = tokenized["token_strs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    // The prompt ends with the assistant's words, not with an end-of-turn token.
    assert_eq!(strs.last(), Some(&"Ġis"), "{strs:?}");
    assert_eq!(
        v["usage"]["prompt_tokens"], tokenized["count"],
        "chat and /tokenize render alike"
    );
}

/// Slow bodies: a client that declares a body and trickles it gets 408 and its connection
/// closed within the grace period plus its length at the minimum rate; a Content-Length
/// over the limit gets 413 before any of the body is sent; without the key, an unknown
/// route and a wrong content type get 401, as does `Bearer` with two spaces.
#[test]
fn slow_bodies_oversized_declarations_and_auth_first() {
    let server = start_with(&model(), &["--api-key", "k3y"]);
    let port = server.port;
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n\
          Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("--body-read-timeout"), "{reply}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n\
          Content-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n",
    )
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = [0u8; 64];
    let n = s.read(&mut head).unwrap();
    let head = String::from_utf8_lossy(&head[..n]);
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    for (method, path, headers) in [
        ("GET", "/no/such/route", vec![]),
        (
            "POST",
            "/v1/completions",
            vec![("Content-Type", "text/plain")],
        ),
        ("GET", "/v1/models", vec![("Authorization", "Bearer  k3y")]),
    ] {
        let (status, _, body) = request_with(port, method, path, &headers, Some("x")).unwrap();
        assert_eq!(status, 401, "{method} {path} {headers:?}: {body}");
    }
    let key = [("Authorization", "Bearer k3y")];
    let (status, _, _) = request_with(port, "GET", "/no/such/route", &key, None).unwrap();
    assert_eq!(status, 404);
}

/// A client that asks for a large response and then reads none of it is cut after
/// `--send-timeout`: with one connection slot, the next client gets in.
#[test]
fn a_client_that_stops_reading_gives_its_slot_back() {
    // The text is charged the tokenizer's worst case, 320 bytes per byte (1.9 GB).
    let server = start_with(
        &model(),
        &[
            "--max-connections",
            "1",
            "--send-timeout",
            "2",
            "--max-request-memory",
            "4GiB",
        ],
    );
    // About 20 MB of response (each token's id and string), more than the socket buffers
    // on both ends hold.
    let body = json!({"prompt": "hello ".repeat(1_000_000), "return_token_strs": true}).to_string();
    let silent = server::send(server.port, "POST", "/tokenize", &[], &body).unwrap();
    let started = Instant::now();
    // Without the send timeout this one waits for as long as the silent client lives.
    let mut next = server::send(server.port, "GET", "/health", &[], "").unwrap();
    next.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut reply = String::new();
    let _ = next.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply:.200}");
    eprintln!("the next client got in after {:?}", started.elapsed());
    drop(silent);
}
