//! A long prompt's prefill does not hold other requests up (`core/prefill_share.rs`): a
//! short greedy request sent while a 1,200-token completion or embedding input is being
//! prefilled finishes within twice its idle latency plus about one step of the long
//! prompt, where it used to wait for the whole prefill.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::model;
use crate::server::{request, start_with, Server};

const LONG_PROMPT_TOKENS: usize = 1_200;
/// The prefill budget per step (the default `--max-prefill-tokens`).
const CHUNK: usize = 256;

fn post(server: &Server, path: &str, body: &Value) -> Value {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    assert_eq!(status, 200, "{text:.300}");
    serde_json::from_str(&text).unwrap()
}

/// A 4-token greedy completion's latency.
fn short_request(server: &Server) -> Duration {
    let started = Instant::now();
    let body = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0});
    let v = post(server, "/v1/completions", &body);
    assert_eq!(v["usage"]["completion_tokens"], 4);
    started.elapsed()
}

/// The slowest short request sent every 200 ms while `long` runs, and `long`'s time.
fn during(server: &Server, long: impl FnOnce() + Send) -> (Duration, Duration) {
    std::thread::scope(|scope| {
        let started = Instant::now();
        let long = scope.spawn(move || {
            long();
            started.elapsed()
        });
        // Into the prefill before the first one.
        std::thread::sleep(Duration::from_millis(500));
        let mut slowest = Duration::ZERO;
        while !long.is_finished() {
            slowest = slowest.max(short_request(server));
            std::thread::sleep(Duration::from_millis(200));
        }
        (slowest, long.join().unwrap())
    })
}

#[test]
fn a_short_request_is_not_held_up_by_a_long_prefill() {
    let server = start_with(
        &model(),
        &["--max-model-len", "4096", "--kv-cache-memory", "256MiB"],
    );
    short_request(&server);
    let idle = (0..3).map(|_| short_request(&server)).min().unwrap();
    // Distinct tokens each time, so no prefix is cached.
    let prompt = |salt: u32| -> Vec<u32> {
        (0..LONG_PROMPT_TOKENS as u32)
            .map(|i| 100 + (i * 7 + salt) % 40_000)
            .collect()
    };
    let steps = LONG_PROMPT_TOKENS.div_ceil(CHUNK) as u32;
    for (route, body) in [
        (
            "/v1/completions",
            json!({"prompt": prompt(1), "max_tokens": 1, "temperature": 0}),
        ),
        ("/v1/embeddings", json!({"input": prompt(2)})),
    ] {
        let (slowest, long) = during(&server, || {
            post(&server, route, &body);
        });
        // A step at the end of the prompt costs up to about twice the average one (its
        // attention reads the whole prompt); the bystander may arrive just as one starts.
        let step = long / steps;
        let bound = idle * 2 + step * 2;
        eprintln!(
            "{route}: {LONG_PROMPT_TOKENS}-token prompt {long:?} ({step:?} a step); a \
             4-token request {idle:?} idle, at most {slowest:?} during it (bound {bound:?})"
        );
        assert!(
            slowest <= bound,
            "{route}: a short request took {slowest:?} during the long prefill, over \
             {bound:?} (idle {idle:?}, the long prompt {long:?})"
        );
    }
}
