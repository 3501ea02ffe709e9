//! `minivllm serve` end to end: the real binary on a loopback port, spoken to over plain HTTP.

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common;
use crate::server;
use common::model;
use server::{
    metric, metrics, request, request_with, send, start, start_with, wait_for_metrics, Server,
};

fn post(server: &Server, path: &str, body: Value) -> (u16, Value) {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    (status, v)
}

fn sse_events(server: &Server, path: &str, body: Value) -> Vec<String> {
    let (status, text) = request(server.port, "POST", path, Some(&body.to_string())).unwrap();
    assert_eq!(status, 200, "{text}");
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| e.strip_prefix("data: ").expect(e).to_string())
        .collect()
}

#[test]
fn serve_openai_api() {
    let server = start(&model());
    let prompt = "The capital of France is";

    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"model": "smol", "prompt": prompt, "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(text.starts_with(" Paris."), "{text:?}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["prompt_tokens"], 5, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["total_tokens"], 13);

    let events = sse_events(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0)?["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, text);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 8);

    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"model": "smol", "max_tokens": 16, "temperature": 0,
               "messages": [{"role": "user", "content": "What is the capital of Germany?"}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of Germany is Berlin."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let events = sse_events(
        &server,
        "/v1/chat/completions",
        json!({"max_tokens": 16, "temperature": 0, "stream": true,
               "messages": [{"role": "user", "content": "What is the capital of Germany?"}]}),
    );
    assert_eq!(events.last().unwrap(), "[DONE]");
    let streamed: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(streamed, "The capital of Germany is Berlin.");

    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "temperature": -1}),
    );
    assert_eq!(status, 400);
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["param"], "temperature");
    assert_eq!(v["error"]["code"], 400);

    let (status, text) =
        request(server.port, "POST", "/v1/completions", Some("{not json")).unwrap();
    assert_eq!(status, 400, "{text}");

    // vLLM's answer to a model it does not serve.
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"model": "other", "prompt": "x"}),
    );
    assert_eq!(status, 404);
    assert_eq!(v["error"]["type"], "NotFoundError");
    assert_eq!(v["error"]["param"], "model");

    let (status, text) = request(server.port, "GET", "/v1/models", None).unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"][0]["id"], "smol");

    // A huge `n` is refused before anything is sized by it (it used to abort the process
    // on allocation failure when streamed), and the server keeps serving.
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": prompt, "n": 1_000_000_000_000u64, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}],
                                         "n": 257, "max_tokens": 2}),
        ),
        (
            "/v1/completions",
            json!({"prompt": prompt, "n": 1, "best_of": 300, "max_tokens": 2}),
        ),
    ] {
        let (status, v) = post(&server, path, body.clone());
        assert_eq!(status, 400, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains("--max-num-seqs 256"), "{msg}");
    }
    // logit_bias reaches the sampler: +100 on one token makes greedy decoding repeat it.
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 3, "temperature": 0,
               "logit_bias": {"28": 100}}),
    );
    assert_eq!(status, 200, "{v}");
    let (_, t) = post(&server, "/detokenize", json!({"tokens": [28]}));
    let forced = t["prompt"].as_str().unwrap().repeat(3);
    assert_eq!(v["choices"][0]["text"], forced, "{v}");
    for bias in [json!({"28": 101}), json!({"999999": 1}), json!({"x": 1})] {
        let (status, v) = post(
            &server,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 1, "logit_bias": bias}),
        );
        assert_eq!(status, 400, "{bias}: {v}");
    }

    // Only JSON bodies: a form or text POST is what a web page can send without a preflight.
    let body = json!({"prompt": prompt, "max_tokens": 2}).to_string();
    for mime in ["text/plain", "application/x-www-form-urlencoded", ""] {
        let headers = [("Content-Type", mime)];
        for path in ["/v1/completions", "/tokenize"] {
            let (status, _, text) =
                request_with(server.port, "POST", path, &headers, Some(&body)).unwrap();
            assert_eq!(status, 415, "{mime:?} {path}: {text}");
        }
    }
    let headers = [("Content-Type", "application/json; charset=utf-8")];
    let (status, _, text) =
        request_with(server.port, "POST", "/tokenize", &headers, Some(&body)).unwrap();
    assert_eq!(status, 200, "{text}");

    let body = json!({"prompt": prompt, "n": 2, "best_of": 3, "stream": true});
    let (status, v) = post(&server, "/v1/completions", body);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "best_of");
    // 3 sampled, the 2 most likely returned (usage counts those, as vLLM's does).
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "n": 2, "best_of": 3, "max_tokens": 3, "seed": 1}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 6, "{v}");
}

/// Starts a streaming request and reads until its first event, leaving the stream open.
fn open_stream(server: &Server, body: Value) -> TcpStream {
    let mut s = send(
        server.port,
        "POST",
        "/v1/completions",
        &[],
        &body.to_string(),
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    s
}

#[test]
fn tokenize_request_ids_echo_and_content_parts() {
    let server = start(&model());
    let prompt = "The capital of France is";
    let (status, v) = post(&server, "/tokenize", json!({"prompt": prompt}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["count"].clone(), v["max_model_len"].clone()),
        (json!(5), json!(1024))
    );
    let (_, d) = post(&server, "/detokenize", json!({"tokens": v["tokens"]}));
    assert_eq!(d["prompt"], prompt);
    let (status, e) = post(&server, "/detokenize", json!({"tokens": [1_000_000]}));
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("tokens"))
    );
    let (status, _) = post(&server, "/tokenize", json!({}));
    assert_eq!(status, 400);

    // The chat form counts what a chat completion is charged as its prompt, and content
    // given as text parts renders exactly like plain content.
    let question = "What is the capital of Germany?";
    let plain = json!([{"role": "user", "content": question}]);
    let parts = json!([{"role": "user", "content": [{"type": "text", "text": question}]}]);
    let (_, t) = post(&server, "/tokenize", json!({"messages": plain}));
    let (_, c) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": parts, "max_tokens": 16, "temperature": 0}),
    );
    assert_eq!(t["count"], c["usage"]["prompt_tokens"], "{c}");
    assert_eq!(
        c["choices"][0]["message"]["content"],
        "The capital of Germany is Berlin."
    );
    let image =
        json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]);
    let (status, e) = post(&server, "/v1/chat/completions", json!({"messages": image}));
    assert_eq!(
        (status, e["error"]["param"].clone()),
        (400, json!("messages"))
    );

    // A client's request id names the response, and comes back as a header.
    let body = json!({"prompt": "Hi", "max_tokens": 2}).to_string();
    let headers = [("X-Request-Id", "my-req-1")];
    let complete = || {
        let path = "/v1/completions";
        request_with(server.port, "POST", path, &headers, Some(&body)).unwrap()
    };
    let (status, head, text) = complete();
    assert_eq!(status, 200, "{text}");
    assert!(head.contains("x-request-id: my-req-1"), "{head}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["id"], "cmpl-my-req-1");
    // Two requests in flight with the same client id both run (the engine names them apart).
    let long = json!({"prompt": "Hi", "max_tokens": 64, "stream": true}).to_string();
    let mut first = server::send(server.port, "POST", "/v1/completions", &headers, &long).unwrap();
    // Its response has begun, so the engine holds the request, before the second arrives.
    let mut status_line = [0u8; 12];
    first.read_exact(&mut status_line).unwrap();
    assert_eq!(&status_line, b"HTTP/1.1 200");
    let (status, _, text) = complete();
    assert_eq!(status, 200, "{text}");
    let first = read_to_end_lossy(first);
    assert!(first.contains("[DONE]"), "{first}");

    // echo with logprobs covers the prompt's tokens too, the first one without a logprob.
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": true, "logprobs": 2}),
    );
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("{prompt} Paris")), "{text:?}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 5 + 3, "{lp}");
    assert_eq!(tokens.concat(), text);
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    for i in 1..8 {
        let x = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(x <= 0.0, "{lp}");
        let n = lp["top_logprobs"][i].as_object().unwrap().len();
        assert!((1..=3).contains(&n), "{lp}");
    }
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = tokens
        .iter()
        .scan(0, |pos, t| {
            let at = *pos;
            *pos += t.chars().count() as u64;
            Some(at)
        })
        .collect();
    assert_eq!(offsets, expected);

    // Streamed, the chunks' offsets carry on from one chunk to the next.
    let events = sse_events(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "echo": true,
               "logprobs": 2, "stream": true}),
    );
    let (mut streamed_tokens, mut streamed_offsets) = (Vec::new(), Vec::new());
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        let lp = &c["choices"][0]["logprobs"];
        for (t, o) in lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .zip(lp["text_offset"].as_array().unwrap())
        {
            streamed_tokens.push(t.as_str().unwrap().to_string());
            streamed_offsets.push(o.as_u64().unwrap());
        }
    }
    assert_eq!(streamed_tokens, tokens);
    assert_eq!(streamed_offsets, expected);

    // A token whose text is held back (it could begin a stop string) sends its logprobs
    // with the next chunk, so every token's logprobs arrive, in both APIs.
    let stop = json!({"max_tokens": 4, "temperature": 0, "stream": true, "stop": [" Paris is", "The cat"],
                      "stream_options": {"include_usage": true}});
    let mut completion = stop.clone();
    completion["prompt"] = json!(prompt);
    completion["logprobs"] = json!(1);
    let mut chat = stop;
    chat["messages"] = json!([{"role": "user", "content": "What is the capital of Germany?"}]);
    chat["logprobs"] = json!(true);
    for (path, body, entries) in [
        ("/v1/completions", completion, "/logprobs/tokens"),
        ("/v1/chat/completions", chat, "/logprobs/content"),
    ] {
        let events = sse_events(&server, path, body);
        let chunks: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        let sent: usize = chunks
            .iter()
            .filter_map(|c| {
                c["choices"]
                    .get(0)?
                    .pointer(entries)?
                    .as_array()
                    .map(Vec::len)
            })
            .sum();
        let usage = &chunks.last().unwrap()["usage"];
        assert_eq!(
            usage["completion_tokens"],
            json!(sent),
            "{path}: {events:?}"
        );
    }
}

#[test]
fn api_key_queue_limit_body_limit_and_cors() {
    let server = start_with(
        &model(),
        &[
            "--api-key",
            "secret",
            "--max-waiting-requests",
            "1",
            "--max-num-seqs",
            "1",
            "--allowed-origins",
            "http://example.com",
            "--max-request-body-size",
            "4KiB",
        ],
    );
    let port = server.port;
    for auth in [None, Some("Bearer wrong"), Some("secret")] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let (status, _, body) = request_with(port, "GET", "/v1/models", &headers, None).unwrap();
        assert_eq!(status, 401, "{auth:?}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["type"], "AuthenticationError");
    }
    let key = [("Authorization", "Bearer secret")];
    let (status, _, _) = request_with(port, "GET", "/v1/models", &key, None).unwrap();
    assert_eq!(status, 200);
    for open in ["/health", "/metrics", "/version"] {
        assert_eq!(request(port, "GET", open, None).unwrap().0, 200, "{open}");
    }

    // Anthropic's clients send the key as `x-api-key`, and read errors in Anthropic's
    // envelope on its routes, whichever layer refused the request.
    let (status, _, _) =
        request_with(port, "GET", "/v1/models", &[("x-api-key", "secret")], None).unwrap();
    assert_eq!(status, 200);
    let ask =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    for (headers, want) in [
        (vec![("x-api-key", "wrong")], (401, "authentication_error")),
        (vec![("x-api-key", "secret")], (404, "not_found_error")),
    ] {
        let (status, _, text) =
            request_with(port, "POST", "/v1/messages", &headers, Some(&ask)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (status, v["type"].as_str()),
            (want.0, Some("error")),
            "{text}"
        );
        assert_eq!(v["error"]["type"], want.1, "{text}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
    }
    let huge =
        json!({"max_tokens": 1, "messages": [{"role": "user", "content": "x".repeat(8 << 10)}]})
            .to_string();
    let (status, _, text) = request_with(
        port,
        "POST",
        "/v1/messages",
        &[("x-api-key", "secret")],
        Some(&huge),
    )
    .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (status, &v["error"]["type"]),
        (413, &json!("request_too_large"))
    );

    // The chat page is open (it asks for the key itself), and says so.
    let (status, head, page) = request_with(port, "GET", "/", &[], None).unwrap();
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("text/html") && head.contains("content-security-policy"),
        "{head}"
    );
    assert!(page.contains("/v1/chat/completions") && page.contains("key-panel"));

    let small = json!({"prompt": "hi"}).to_string();
    for path in ["/tokenize", "/detokenize"] {
        let (status, text) = request(port, "POST", path, Some(&small)).unwrap();
        assert_eq!(status, 401, "{path} without the key: {text}");
    }
    let big = json!({"prompt": "x".repeat(8 << 10)}).to_string();
    let (status, _, text) = request_with(port, "POST", "/tokenize", &key, Some(&big)).unwrap();
    assert_eq!(status, 413, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], 413);

    let preflight = [
        ("Origin", "http://example.com"),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization,content-type",
        ),
    ];
    let (status, head, _) =
        request_with(port, "OPTIONS", "/v1/completions", &preflight, None).unwrap();
    assert!(status < 300, "{status} {head}");
    assert!(
        head.contains("access-control-allow-origin: http://example.com"),
        "{head}"
    );
    let other = [("Origin", "http://evil.example")];
    let (_, head, _) = request_with(port, "GET", "/health", &other, None).unwrap();
    assert!(!head.contains("access-control-allow-origin"), "{head}");

    // One sequence runs, one waits; the next request is turned away with 503 at once.
    let long = |auth: &str| {
        let body = json!({"prompt": "Tell me a story.", "max_tokens": 300, "ignore_eos": true,
                          "stream": true})
        .to_string();
        let mut s = send(
            port,
            "POST",
            "/v1/completions",
            &[("Authorization", auth)],
            &body,
        )
        .unwrap();
        let mut b = [0u8; 64];
        assert!(s.read(&mut b).unwrap() > 0);
        s
    };
    let running = long("Bearer secret");
    wait_for_metrics(&server, "one running", |m| {
        metric(m, "vllm:num_requests_running", "") == 1.0
    });
    let waiting = long("Bearer secret");
    wait_for_metrics(&server, "one waiting", |m| {
        metric(m, "vllm:num_requests_waiting", "") == 1.0
    });
    let body = json!({"prompt": "Hi", "max_tokens": 2}).to_string();
    let (status, _, text) =
        request_with(port, "POST", "/v1/completions", &key, Some(&body)).unwrap();
    assert_eq!(status, 503, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["type"], "ServiceUnavailableError");
    drop((running, waiting));
    wait_for_metrics(&server, "the queue to drain", |m| {
        metric(m, "vllm:num_requests_running", "") == 0.0
            && metric(m, "vllm:num_requests_waiting", "") == 0.0
    });
}

#[test]
fn many_concurrent_streams_and_a_disconnect() {
    let server = start(&model());
    let port = server.port;
    let clients: Vec<_> = (0..64)
        .map(|i| {
            std::thread::spawn(move || {
                let prompt = format!("Request {i}: write a sentence about the number {i}.");
                let body = json!({"prompt": prompt, "max_tokens": 16, "ignore_eos": true,
                                  "temperature": 0, "stream": true,
                                  "stream_options": {"include_usage": true}});
                let (status, _, text) = request_with(
                    port,
                    "POST",
                    "/v1/completions",
                    &[],
                    Some(&body.to_string()),
                )
                .unwrap();
                (prompt, status, text)
            })
        })
        .collect();
    // Meanwhile a client goes away mid-stream.
    let quitter = open_stream(
        &server,
        json!({"prompt": "Tell me a long story.", "max_tokens": 900, "ignore_eos": true,
               "stream": true}),
    );
    drop(quitter);
    let (_, t) = post(
        &server,
        "/tokenize",
        json!({"prompt": "Tell me a long story."}),
    );
    let mut prompt_tokens = t["count"].as_f64().unwrap();
    for c in clients {
        let (prompt, status, text) = c.join().unwrap();
        assert_eq!(status, 200, "{text}");
        let events: Vec<&str> = text
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .collect();
        assert_eq!(events.last(), Some(&"[DONE]"));
        let usage: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
        let (_, t) = post(&server, "/tokenize", json!({"prompt": prompt}));
        assert_eq!(usage["usage"]["completion_tokens"], 16, "{usage}");
        assert_eq!(usage["usage"]["prompt_tokens"], t["count"], "{usage}");
        prompt_tokens += t["count"].as_f64().unwrap();
        let streamed: String = events[..events.len() - 2]
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).unwrap())
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        assert!(!streamed.is_empty());
    }
    wait_for_metrics(&server, "every block freed", |m| {
        metric(m, "vllm:num_requests_running", "") == 0.0
            && metric(m, "vllm:kv_cache_usage_perc", "") == 0.0
    });
    let m = metrics(&server);
    assert_eq!(metric(&m, "vllm:request_success_total", "\"abort\""), 1.0);
    assert_eq!(metric(&m, "vllm:request_success_total", "\"length\""), 64.0);
    assert!(metric(&m, "vllm:generation_tokens_total", "") >= 64.0 * 16.0);
    assert_eq!(metric(&m, "vllm:prompt_tokens_total", ""), prompt_tokens);
    assert_eq!(
        metric(&m, "vllm:time_to_first_token_seconds_count", ""),
        65.0
    );
}

/// The README's `curl` lines (continuations joined), from the serve section's code block.
fn readme_curl_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("read README.md");
    let mut commands = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        if let Some(cmd) = current.as_mut() {
            cmd.push(' ');
            cmd.push_str(line.trim_end_matches('\\').trim());
        } else if line.starts_with("curl ") {
            current = Some(line.trim_end_matches('\\').trim().to_string());
        }
        if !line.ends_with('\\') {
            commands.extend(current.take());
        }
    }
    commands
}

#[test]
fn readme_curl_examples_work() {
    let commands = readme_curl_commands();
    assert!(commands.len() >= 4, "{commands:?}");
    let server = start(&model());
    for cmd in commands {
        // As written, but against this test's port.
        let cmd = cmd.replace("127.0.0.1:8000", &format!("127.0.0.1:{}", server.port));
        let out = Command::new("bash")
            .args(["-c", &format!("set -o pipefail; {cmd}")])
            .output()
            .expect("run bash (and curl)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !stdout.trim().is_empty(),
            "{cmd}\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // An error object, not the Responses object's `"error": null`.
        assert!(!stdout.contains("\"error\":{"), "{cmd}\n{stdout}");
        if ["/chat/completions", "/v1/messages", "/v1/responses"]
            .iter()
            .any(|route| cmd.contains(route))
        {
            assert!(stdout.contains("Berlin"), "{cmd}\n{stdout}");
        }
    }
}

fn read_to_end_lossy(mut s: TcpStream) -> String {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    String::from_utf8_lossy(&raw).into_owned()
}

fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    let ok = Command::new("kill").args([sig, &pid]).status().unwrap();
    assert!(ok.success());
}

fn wait_exit(server: &mut Server, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "server still running");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(unix)]
#[test]
fn sigterm_finishes_requests_in_flight_and_a_second_one_aborts() {
    let mut server = start(&model());
    let stream = |max_tokens: usize| {
        json!({"prompt": "Tell me a story.", "max_tokens": max_tokens, "ignore_eos": true,
               "stream": true})
    };
    let short = open_stream(&server, stream(24));
    let long = open_stream(&server, stream(900));
    signal(&server, "-TERM");
    let text = read_to_end_lossy(short);
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    // The long request is still being served; a second signal ends it and the server.
    assert!(server.child.try_wait().unwrap().is_none());
    signal(&server, "-TERM");
    let status = wait_exit(&mut server, Duration::from_secs(20));
    assert!(status.success(), "{status}");
    assert!(!read_to_end_lossy(long).contains("data: [DONE]"));
}

/// A connection that sends part of its headers and then nothing.
fn slow_client(server: &Server) -> TcpStream {
    use std::io::Write;
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    s
}

/// Whether the server closed `s` within `within` (a read that returns end of file).
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // a 408 before the close is fine
            Err(_) => return false,
        }
    }
}

/// Slow clients cannot hold the server: a connection that never finishes its headers is
/// closed after `--header-read-timeout`; at `--max-connections` further connections wait
/// (are not accepted) until one closes (here, by that timeout); and `--shutdown-timeout`
/// ends a graceful shutdown that a long response would otherwise hold open.
#[cfg(unix)]
#[test]
fn slow_clients_are_timed_out_limited_and_cut_at_shutdown() {
    let mut server = start_with(
        &model(),
        &[
            "--header-read-timeout",
            "1",
            "--max-connections",
            "2",
            "--shutdown-timeout",
            "2",
        ],
    );
    let mut first = slow_client(&server);
    assert!(
        closed_within(&mut first, Duration::from_secs(5)),
        "header timeout"
    );

    // Two idle connections fill the limit; a third client's request waits for a slot.
    let a = slow_client(&server);
    let _b = slow_client(&server);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let (status, _) = request(server.port, "GET", "/health", None).unwrap();
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "served at once though both slots were taken ({:?})",
        started.elapsed()
    );
    drop(a);

    // A response still streaming when shutdown begins is cut at the deadline instead of
    // holding the server until it ends.
    let long = open_stream(
        &server,
        json!({"prompt": "Tell me a story.", "max_tokens": 900, "ignore_eos": true, "stream": true}),
    );
    let shutdown = Instant::now();
    signal(&server, "-TERM");
    let status = wait_exit(&mut server, Duration::from_secs(8));
    assert!(status.success(), "{status}");
    assert!(
        shutdown.elapsed() >= Duration::from_secs(2),
        "{:?}",
        shutdown.elapsed()
    );
    assert!(!read_to_end_lossy(long).contains("data: [DONE]"));
}

/// `--request-timeout`: a request whose response has not started in time gets 408, and the
/// engine's work for it is dropped (the server goes on serving).
#[test]
fn request_timeout_answers_408() {
    let server = start_with(&model(), &["--request-timeout", "0.05"]);
    let body = json!({"prompt": "word ".repeat(700), "max_tokens": 200, "ignore_eos": true});
    let (status, text) = request(
        server.port,
        "POST",
        "/v1/completions",
        Some(&body.to_string()),
    )
    .unwrap();
    assert_eq!(status, 408, "{text}");
    let (status, _) = request(server.port, "GET", "/health", None).unwrap();
    assert_eq!(status, 200);
    wait_for_metrics(&server, "the timed-out request gone", |m| {
        metric(m, "vllm:num_requests_running", "") == 0.0
    });
}

/// Tokenising multi-megabyte prompts runs off the async workers: while two clients keep
/// such requests in flight, `/health` still answers at once.
#[test]
fn large_tokenize_requests_do_not_stall_health() {
    // Each is charged the tokenizer's worst case, 320 bytes per byte of text (1.1 GB).
    let server = start_with(&model(), &["--max-request-memory", "2GiB"]);
    let port = server.port;
    let big =
        json!({"prompt": "Lorem ipsum dolor sit amet, consectetur. ".repeat(80_000)}).to_string();
    // Each client sends its next prompt as soon as the last is answered, until the window
    // ends: the probes below then meet tokenising work however fast the machine is (with
    // one request each, a fast tokenizer could finish before the first probe).
    let window = Duration::from_millis(1500);
    let started = Instant::now();
    let heavy: Vec<_> = (0..2)
        .map(|_| {
            let big = big.clone();
            std::thread::spawn(move || {
                let mut sent = 0;
                while started.elapsed() < window {
                    assert_eq!(
                        request(port, "POST", "/tokenize", Some(&big)).unwrap().0,
                        200
                    );
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    // Past the clients' first upload, into the tokenizing.
    std::thread::sleep(Duration::from_millis(100));
    let (mut worst, mut probes) = (Duration::ZERO, 0);
    while started.elapsed() < window {
        let t = Instant::now();
        let (status, _) = request(port, "GET", "/health", None).unwrap();
        assert_eq!(status, 200);
        worst = worst.max(t.elapsed());
        probes += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent: usize = heavy.into_iter().map(|h| h.join().unwrap()).sum();
    eprintln!(
        "{sent} 3.3 MB prompts tokenised in {:?}; slowest of {probes} /health meanwhile {worst:?}",
        started.elapsed()
    );
    assert!(probes >= 5, "{probes} probes");
    assert!(worst < Duration::from_millis(500), "/health took {worst:?}");
}

#[test]
fn frontend_off_prompt_tokens_details_on_and_all_logprobs_allowed() {
    let server = start_with(
        &model(),
        &[
            "--disable-frontend",
            "--enable-prompt-tokens-details",
            "--max-logprobs",
            "-1",
        ],
    );
    // -1 asks for the whole vocabulary at each position, where the server allows it.
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
               "logprobs": true, "top_logprobs": -1}),
    );
    assert_eq!(status, 200, "{v}");
    let top = v["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(top.len(), 49152);
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": "The capital of France is", "max_tokens": 1, "logprobs": -1,
               "prompt_logprobs": -1}),
    );
    assert_eq!(status, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["prompt_logprobs"][1].as_object().unwrap().len(), 49152);
    let alternatives = c["logprobs"]["top_logprobs"][0].as_object().unwrap().len();
    // Keyed by text, as OpenAI's: tokens whose text is the same (byte pieces of one
    // character decode to "\u{fffd}") share a key (48,843 of SmolLM2's).
    assert!((48000..=49152).contains(&alternatives), "{alternatives}");
    // Each such token costs a vocabulary's worth of response: the request memory limit
    // refuses long ones before any work, naming the field to lower.
    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 1000, "logprobs": -1}),
    );
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("logprobs -1"), "{message}");
    // So are long prompts' vocabulary-wide prompt logprobs (even without echo), and a few
    // Responses tokens (whose stream repeats each list in several events).
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "word ".repeat(300)}], "max_tokens": 1,
               "prompt_logprobs": -1}),
    );
    assert_eq!(status, 400, "{v}");
    let (status, v) = post(
        &server,
        "/v1/responses",
        json!({"input": "Hi", "max_output_tokens": 16, "top_logprobs": -1,
               "include": ["message.output_text.logprobs"]}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-request-memory"),
        "{v}"
    );
    let (status, v) = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true,
               "top_logprobs": -2}),
    );
    assert_eq!(status, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("top_logprobs") && message.contains("-1"),
        "{message}"
    );
    let (status, _) = request(server.port, "GET", "/", None).unwrap();
    assert_eq!(status, 404);
    // The second request finds the first's full blocks in the prefix cache.
    let body = json!({"prompt": "word ".repeat(40), "max_tokens": 1}).to_string();
    let cached: Vec<Value> = (0..2)
        .map(|_| {
            let (status, text) =
                request(server.port, "POST", "/v1/completions", Some(&body)).unwrap();
            assert_eq!(status, 200, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            v["usage"]["prompt_tokens_details"]["cached_tokens"].clone()
        })
        .collect();
    assert_eq!(cached[0], 0);
    assert!(cached[1].as_u64().is_some_and(|n| n >= 32), "{cached:?}");
}

#[test]
fn generation_config_sets_the_defaults_requests_leave_out() {
    let dir = std::env::temp_dir().join(format!("minivllm-gencfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"temperature": 0.0, "max_new_tokens": 5}"#,
    )
    .unwrap();
    let server = start_with(&model(), &["--generation-config", dir.to_str().unwrap()]);
    let ask = |body: Value| {
        let (status, text) = request(
            server.port,
            "POST",
            "/v1/chat/completions",
            Some(&body.to_string()),
        )
        .unwrap();
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<Value>(&text).unwrap()
    };
    let story = json!([{"role": "user", "content": "Tell me a long story about a dragon."}]);
    // Greedy and 5 tokens, from the file: the same reply every time.
    let a = ask(json!({"messages": story}));
    let b = ask(json!({"messages": story}));
    assert_eq!(a["usage"]["completion_tokens"], 5, "{a}");
    assert_eq!(a["choices"][0]["message"], b["choices"][0]["message"]);
    // What a request sets wins.
    let c = ask(json!({"messages": story, "max_tokens": 3}));
    assert_eq!(c["usage"]["completion_tokens"], 3, "{c}");
    std::fs::remove_dir_all(&dir).unwrap();
}
