//! One streamed request to an OpenAI-compatible server, timed chunk by chunk.

use std::time::Instant;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// A prompt to send and how many tokens to ask for.
#[derive(Debug, Clone)]
pub struct BenchRequest {
    pub prompt: String,
    /// The prompt's tokens as the benchmark's tokenizer counts them (used when the server
    /// reports no usage).
    pub prompt_len: usize,
    pub output_len: usize,
    /// A JSON schema the reply is held to (vLLM's `structured_outputs.json`).
    pub schema: Option<Value>,
}

/// Timings of a request that streamed to `[DONE]`, in seconds from when it was sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Success {
    pub ttft: f64,
    /// Gaps between consecutive content chunks after the first.
    pub itl: Vec<f64>,
    pub latency: f64,
    pub text: String,
    pub prompt_tokens: usize,
    /// From the final usage chunk; `None` when the server sent none.
    pub output_tokens: Option<usize>,
}

pub type Outcome = Result<Success, String>;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    url: String,
    model: String,
    chat: bool,
}

/// An HTTP client for benchmarking: no proxy, since a proxy between the benchmark and a
/// (usually local) server would be measured too, and an `http_proxy` set for other tools
/// would otherwise capture loopback traffic.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(std::time::Duration::from_secs(10))
        .build()
        .context("cannot build the HTTP client")
}

/// The model name to send: `given`, or the first one the server lists. Also the check that
/// the server answers at all, so a wrong URL fails once and clearly instead of N times.
pub async fn resolve_model(
    http: &reqwest::Client,
    base: &str,
    given: Option<String>,
) -> anyhow::Result<String> {
    let url = format!("{base}/v1/models");
    let resp = http
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot reach the server at {base}"))?;
    if let Some(model) = given {
        return Ok(model);
    }
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("GET {url} answered {status}: {body} (pass --model to skip it)");
    }
    let listed: Value =
        serde_json::from_str(&body).with_context(|| format!("GET {url}: not JSON: {body}"))?;
    match listed["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("GET {url} lists no model: {body} (pass --model)"),
    }
}

impl Client {
    pub fn new(http: reqwest::Client, base: &str, endpoint: &str, model: String) -> Client {
        Client {
            http,
            url: format!("{base}{endpoint}"),
            model,
            chat: endpoint.trim_end_matches('/').ends_with("chat/completions"),
        }
    }

    /// Standard OpenAI fields plus `ignore_eos` (vLLM and llama-server accept it), so
    /// every request generates exactly `output_len` tokens on any of them.
    fn body(&self, req: &BenchRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": req.output_len,
            "temperature": 0,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.chat {
            body["messages"] = json!([{"role": "user", "content": req.prompt}]);
            // Newer servers read this name; `max_tokens` stays for older ones.
            body["max_completion_tokens"] = json!(req.output_len);
        } else {
            body["prompt"] = json!(req.prompt);
        }
        if let Some(schema) = &req.schema {
            body["structured_outputs"] = json!({"json": schema});
        }
        body
    }

    pub async fn send(&self, req: &BenchRequest) -> Outcome {
        let start = Instant::now();
        let resp = self
            .http
            .post(&self.url)
            .json(&self.body(req))
            .send()
            .await
            .map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
        let status = resp.status();
        if status != reqwest::StatusCode::OK {
            let body = resp.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {body}"));
        }
        let mut stream = Stream::new(self.chat, req.prompt_len);
        let mut bytes = resp.bytes_stream();
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
            if stream.feed(&chunk, start.elapsed().as_secs_f64())? {
                return Ok(stream.done);
            }
        }
        Err("the stream ended without [DONE]".into())
    }
}

/// The state of one server-sent event stream being read.
struct Stream {
    chat: bool,
    /// Bytes of a line not yet ended (network chunks split lines anywhere).
    partial: Vec<u8>,
    /// Time of the latest content chunk, for the next inter-token gap.
    last: Option<f64>,
    done: Success,
}

impl Stream {
    fn new(chat: bool, prompt_len: usize) -> Stream {
        Stream {
            chat,
            partial: Vec::new(),
            last: None,
            done: Success {
                prompt_tokens: prompt_len,
                ..Success::default()
            },
        }
    }

    /// Takes bytes that arrived at `now` (seconds since the request was sent); true once
    /// `[DONE]` was read.
    fn feed(&mut self, bytes: &[u8], now: f64) -> Result<bool, String> {
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if self.line(line.trim(), now)? {
                self.done.latency = now;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn line(&mut self, line: &str, now: f64) -> Result<bool, String> {
        // Blank lines end events; `:` lines are SSE comments (keep-alives).
        let Some(data) = line.strip_prefix("data:").map(str::trim_start) else {
            return Ok(false);
        };
        if data == "[DONE]" {
            return Ok(true);
        }
        let v: Value =
            serde_json::from_str(data).map_err(|e| format!("bad stream chunk {data:?}: {e}"))?;
        if let Some(err) = v.get("error") {
            return Err(format!("error in the stream: {err}"));
        }
        let choice = &v["choices"][0];
        let text = if self.chat {
            &choice["delta"]["content"]
        } else {
            &choice["text"]
        };
        if let Some(text) = text.as_str().filter(|t| !t.is_empty()) {
            match self.last {
                None => self.done.ttft = now,
                Some(last) => self.done.itl.push(now - last),
            }
            self.last = Some(now);
            self.done.text.push_str(text);
        }
        let usage = &v["usage"];
        if let Some(n) = usage["completion_tokens"].as_u64() {
            self.done.output_tokens = Some(n as usize);
        }
        if let Some(n) = usage["prompt_tokens"].as_u64() {
            self.done.prompt_tokens = n as usize;
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chat: bool) -> Stream {
        Stream::new(chat, 7)
    }

    #[test]
    fn completion_stream_split_anywhere() {
        let mut s = stream(false);
        let events = concat!(
            "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\n",
            ": keep-alive\n\n",
            "data: {\"choices\":[{\"text\":\"lo\"}]}\n\n",
            "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        );
        let (a, b) = events.as_bytes().split_at(20);
        assert!(!s.feed(a, 0.5).unwrap());
        assert!(s.feed(b, 0.75).unwrap());
        let d = s.done;
        assert_eq!((d.ttft, d.latency), (0.75, 0.75));
        assert_eq!(d.itl, vec![0.0]);
        assert_eq!(d.text, "Hello");
        assert_eq!((d.prompt_tokens, d.output_tokens), (5, Some(2)));
    }

    #[test]
    fn chat_stream_skips_the_role_chunk_and_keeps_prompt_len_without_usage() {
        let mut s = stream(true);
        let role = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n";
        assert!(!s.feed(role.as_bytes(), 0.1).unwrap());
        let hi = "data:{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n";
        assert!(!s.feed(hi.as_bytes(), 0.2).unwrap());
        let there = "data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n";
        assert!(!s.feed(there.as_bytes(), 0.5).unwrap());
        assert!(s.feed(b"data: [DONE]\n", 0.6).unwrap());
        let d = s.done;
        assert_eq!((d.ttft, d.latency, d.text.as_str()), (0.2, 0.6, "Hi there"));
        assert!((d.itl[0] - 0.3).abs() < 1e-12);
        assert_eq!((d.prompt_tokens, d.output_tokens), (7, None));
    }

    #[test]
    fn error_chunk_fails_the_request() {
        let mut s = stream(false);
        let e = s
            .feed(b"data: {\"error\":{\"message\":\"boom\"}}\n", 0.1)
            .unwrap_err();
        assert!(e.contains("boom"), "{e}");
    }

    #[test]
    fn chat_body_has_messages_and_both_token_limits() {
        let c = Client::new(
            reqwest::Client::new(),
            "http://h",
            "/v1/chat/completions",
            "m".into(),
        );
        let req = BenchRequest {
            prompt: "p".into(),
            prompt_len: 1,
            output_len: 3,
            schema: Some(json!({"type": "object"})),
        };
        let b = c.body(&req);
        assert_eq!(c.url, "http://h/v1/chat/completions");
        assert_eq!(b["messages"][0]["content"], "p");
        assert_eq!(b["structured_outputs"]["json"]["type"], "object");
        assert_eq!(
            (b["max_tokens"].clone(), b["max_completion_tokens"].clone()),
            (json!(3), json!(3))
        );
        assert_eq!(b["ignore_eos"], true);
        assert!(b.get("prompt").is_none());
    }
}
