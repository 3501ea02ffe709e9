//! `minivllm serve` end to end: the real binary on a loopback port, spoken to over plain HTTP.

use serde_json::{json, Value};

mod common;
#[path = "common/server.rs"]
mod server;
use common::model;
use server::{request, start, Server};

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
