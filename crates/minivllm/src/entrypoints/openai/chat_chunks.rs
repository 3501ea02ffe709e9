//! The chat route's stream read back, for the routes that run as chat requests and speak
//! another API (Anthropic's Messages, OpenAI's Responses): each chunk as the pieces of the
//! reply it adds, in order.

use serde_json::{Map, Value};

use crate::entrypoints::openai::protocol::{ApiError, ChatCompletionRequest};

/// What one chunk adds to the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Thinking (`reasoning_content`, with `--reasoning-parser`).
    Thinking(&'a str),
    Text(&'a str),
    /// A tool call begins: its id and function name.
    Call {
        id: &'a str,
        name: &'a str,
    },
    /// More of the last call's arguments (the parsers finish one call before the next).
    Arguments(&'a str),
}

/// A chunk's pieces, its usage (the stream's last chunk, asked for with `include_usage`)
/// and its choice once that has finished (`finish_reason` set).
pub struct Chunk<'a> {
    pub pieces: Vec<Piece<'a>>,
    pub usage: Option<&'a Value>,
    pub finished: Option<&'a Value>,
}

pub fn read_chunk(chunk: &Value) -> Chunk<'_> {
    let usage = Some(&chunk["usage"]).filter(|u| u.is_object());
    let Some(choice) = chunk["choices"].get(0) else {
        return Chunk {
            pieces: Vec::new(),
            usage,
            finished: None,
        };
    };
    let delta = &choice["delta"];
    let text = |key: &str| delta[key].as_str().filter(|t| !t.is_empty());
    let mut pieces = Vec::new();
    pieces.extend(text("reasoning_content").map(Piece::Thinking));
    pieces.extend(text("content").map(Piece::Text));
    for call in delta["tool_calls"].as_array().into_iter().flatten() {
        let f = &call["function"];
        if let Some(id) = call["id"].as_str() {
            let name = f["name"].as_str().unwrap_or_default();
            pieces.push(Piece::Call { id, name });
        }
        if let Some(args) = f["arguments"].as_str().filter(|a| !a.is_empty()) {
            pieces.push(Piece::Arguments(args));
        }
    }
    Chunk {
        pieces,
        usage,
        finished: Some(choice).filter(|c| !c["finish_reason"].is_null()),
    }
}

/// Sets each `(key, value)` whose value is not null: a translated request's optional fields.
pub fn set_present<const N: usize>(fields: &mut Map<String, Value>, pairs: [(&str, Value); N]) {
    for (key, value) in pairs {
        if !value.is_null() {
            fields.insert(key.into(), value);
        }
    }
}

/// A translated request's `tools`, each converted by `tool` (with its index), for the chat
/// request's `tools` field.
pub fn chat_tools(
    tools: &[Value],
    tool: impl Fn(&Value, usize) -> Result<Value, ApiError>,
) -> Result<Value, ApiError> {
    let tools: Result<Vec<Value>, ApiError> =
        tools.iter().enumerate().map(|(i, t)| tool(t, i)).collect();
    Ok(Value::Array(tools?))
}

/// A translated request's chat JSON as the chat request it is, with the chat route's message
/// for what does not parse.
pub fn chat_request(chat: Value) -> Result<ChatCompletionRequest, ApiError> {
    serde_json::from_value(chat)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
}
