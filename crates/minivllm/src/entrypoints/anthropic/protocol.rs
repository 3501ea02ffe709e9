//! Anthropic's Messages request, read into the chat request the engine's chat route runs
//! (as vLLM's `entrypoints/anthropic` does), and Anthropic's error envelope.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::entrypoints::openai::chat_chunks::{chat_request, chat_tools, set_present};
use crate::entrypoints::openai::protocol::{ApiError, ChatCompletionRequest};

/// `POST /v1/messages` (and `/v1/messages/count_tokens`, which has no `max_tokens`). Fields
/// the SDK sends that change nothing here (`metadata`, `thinking`, `service_tier`, ...) are
/// accepted and ignored, as vLLM does.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub messages: Vec<Value>,
    pub system: Option<Value>,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i32>,
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
}

impl MessagesRequest {
    /// The same request as a chat request: the system prompt first, text blocks joined,
    /// `tool_use` blocks as the assistant's calls, `tool_result` blocks as `tool` turns, and
    /// a final assistant turn continued (Anthropic's prefill).
    pub fn to_chat(&self, with_max_tokens: bool) -> Result<ChatCompletionRequest, ApiError> {
        let max_tokens = match self.max_tokens {
            Some(0) => return Err(bad("max_tokens must be at least 1", "max_tokens")),
            None if with_max_tokens => return Err(bad("max_tokens: Field required", "max_tokens")),
            m => m,
        };
        let mut messages = Vec::with_capacity(self.messages.len() + 1);
        if let Some(system) = &self.system {
            messages.push(json!({"role": "system", "content": text_of(system, "system")?}));
        }
        for (i, m) in self.messages.iter().enumerate() {
            message(m, i, &mut messages)?;
        }
        let prefill = self.messages.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
        let mut chat = json!({
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": self.stream,
            "add_generation_prompt": !prefill,
            "continue_final_message": prefill,
        });
        let fields = chat.as_object_mut().expect("an object");
        set_present(
            fields,
            [
                ("model", json!(self.model)),
                ("temperature", json!(self.temperature)),
                ("top_p", json!(self.top_p)),
                ("top_k", json!(self.top_k)),
                ("stop", json!(self.stop_sequences)),
            ],
        );
        if let Some(tools) = &self.tools {
            fields.insert("tools".into(), chat_tools(tools, tool)?);
        }
        if let Some(choice) = &self.tool_choice {
            tool_choice(choice, fields)?;
        }
        chat_request(chat)
    }
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// A string, or a list of text blocks, as one string.
fn text_of(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (kind, _) => {
                        return Err(bad(
                            format!(
                                "{at}[{j}]: expected a text block, got {}",
                                kind.map_or("no `type`".to_string(), |k| format!("type `{k}`"))
                            ),
                            at,
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(bad(
            format!("{at}: expected a string or a list of text blocks"),
            at,
        )),
    }
}

/// Message `i` as chat messages (a user turn with tool results becomes `tool` turns, then
/// the user's text if any).
fn message(m: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(bad(
                format!("{at}.role: Input should be 'user' or 'assistant'"),
                "messages",
            ))
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(text)) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(bad(
                format!("{at}.content: expected a string or a list of content blocks"),
                "messages",
            ))
        }
    };
    let (mut texts, mut calls) = (Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let field = |name: &str| {
            b.get(name)
                .ok_or_else(|| bad(format!("{at}: `{name}` is required"), "messages"))
        };
        match (b.get("type").and_then(Value::as_str), role) {
            (Some("text"), _) => match field("text")? {
                Value::String(t) => texts.push(t.clone()),
                _ => return Err(bad(format!("{at}.text: expected a string"), "messages")),
            },
            (Some("tool_use"), "assistant") => {
                let input = field("input")?;
                if !input.is_object() {
                    return Err(bad(format!("{at}.input: expected an object"), "messages"));
                }
                calls.push(json!({
                    "id": field("id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": input.to_string()},
                }));
            }
            (Some("tool_result"), "user") => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"))?,
                };
                out.push(json!({
                    "role": "tool", "tool_call_id": field("tool_use_id")?, "content": content,
                }));
            }
            // Earlier thinking is not shown to the model again, as chat templates drop it.
            (Some("thinking" | "redacted_thinking"), "assistant") => {}
            (Some(kind), _) => {
                return Err(bad(
                    format!(
                        "{at}: content blocks of type `{kind}` are not supported in {role} \
                         turns here (text, tool_use from the assistant, tool_result from the \
                         user, thinking)"
                    ),
                    "messages",
                ))
            }
            (None, _) => return Err(bad(format!("{at}: `type` is required"), "messages")),
        }
    }
    if !texts.is_empty() || !calls.is_empty() {
        let mut turn = json!({"role": role, "content": texts.join("\n")});
        if !calls.is_empty() {
            turn["tool_calls"] = Value::Array(calls);
        }
        out.push(turn);
    }
    Ok(())
}

/// Tool `i` (`name`, `description`, `input_schema`) as an OpenAI function.
fn tool(t: &Value, i: usize) -> Result<Value, ApiError> {
    let (Some(name), Some(schema)) = (t.get("name").and_then(Value::as_str), t.get("input_schema"))
    else {
        return Err(bad(
            format!(
                "tools[{i}]: only client tools with a `name` and an `input_schema` are \
                 supported (no server tools)"
            ),
            "tools",
        ));
    };
    let mut function = json!({"name": name, "parameters": schema});
    if let Some(d) = t.get("description") {
        function["description"] = d.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

/// `tool_choice` as OpenAI's: `auto`, `any` (required), `tool` (a named function), `none`;
/// `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn tool_choice(choice: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let openai = match (
        choice.get("type").and_then(Value::as_str),
        choice.get("name"),
    ) {
        (Some("auto"), _) => json!("auto"),
        (Some("any"), _) => json!("required"),
        (Some("none"), _) => json!("none"),
        (Some("tool"), Some(Value::String(name))) => {
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(bad(
                "tool_choice: expected {\"type\": \"auto\" | \"any\" | \"none\"} or \
                 {\"type\": \"tool\", \"name\": ...}",
                "tool_choice",
            ))
        }
    };
    chat.insert("tool_choice".into(), openai);
    if choice.get("disable_parallel_tool_use") == Some(&json!(true)) {
        chat.insert("parallel_tool_calls".into(), json!(false));
    }
    Ok(())
}

/// Anthropic's error `type` for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    }
}

/// The error body of the Messages routes, `{"type": "error", "error": {type, message}}`.
pub fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// Rewrites every error of the Messages routes (whichever layer refused the request: the
/// API key, the body's size, its JSON, the handler) into Anthropic's envelope, whose `type`
/// names the SDK's exception.
pub async fn anthropic_errors(req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/v1/messages") {
        return next.run(req).await;
    }
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // Error bodies are a few hundred bytes; anything longer is cut, not held.
    let bytes = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(error_body(status, &message).to_string()))
}
