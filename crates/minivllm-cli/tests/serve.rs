//! `minivllm serve` end to end: the real binary on a loopback port, spoken to over plain HTTP.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::model;

/// Kills the server however the test ends, so a failed assertion leaves no process behind.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    // The port is free once this listener drops; the server binds it right after.
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(model: &str) -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_minivllm"))
        .args([
            "serve",
            "--model",
            model,
            "--served-model-name",
            "smol",
            "--port",
            &port.to_string(),
            "--kv-cache-memory",
            "64MiB",
            "--max-model-len",
            "1024",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("start minivllm serve");
    let mut server = Server { child, port };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((200, _)) = request(port, "GET", "/health", None) {
            return server;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("server exited early: {status}");
        }
        assert!(Instant::now() < deadline, "server not healthy in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A minimal HTTP/1.1 client: one request per connection, body read to the end.
fn request(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

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
               "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let events = sse_events(
        &server,
        "/v1/chat/completions",
        json!({"max_tokens": 16, "temperature": 0, "stream": true,
               "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
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
    assert_eq!(streamed, "The capital of France is Paris.");

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

    let (status, v) = post(
        &server,
        "/v1/completions",
        json!({"model": "other", "prompt": "x"}),
    );
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "model");

    let (status, text) = request(server.port, "GET", "/v1/models", None).unwrap();
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"][0]["id"], "smol");
}
