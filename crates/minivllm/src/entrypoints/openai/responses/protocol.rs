//! OpenAI's Responses request, read into the chat request the chat route runs (as vLLM's
//! and llama-server's do).

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::entrypoints::openai::chat_chunks::{chat_request, chat_tools, set_present};
use crate::entrypoints::openai::protocol::{ApiError, ChatCompletionRequest};
use crate::sampling_params::logprob_count;

/// `POST /v1/responses`. Stateless: nothing is stored, so `previous_response_id` is refused
/// (send the conversation in `input`, as `store: false` clients do). Fields that change
/// nothing here (`reasoning`, `service_tier`, other `include` values, ...) are accepted and
/// ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Value,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub previous_response_id: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<Value>,
    pub metadata: Option<Value>,
    pub user: Option<String>,
    pub background: Option<bool>,
    pub prompt: Option<Value>,
    /// Extra outputs; `message.output_text.logprobs` is the one this server fills.
    pub include: Option<Vec<String>>,
    /// Alternatives per token with `message.output_text.logprobs` (as chat's).
    #[serde(default, deserialize_with = "logprob_count::deserialize_opt")]
    pub top_logprobs: Option<usize>,
}

/// The `include` value that asks for the output text's logprobs.
const OUTPUT_LOGPROBS: &str = "message.output_text.logprobs";

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

impl ResponsesRequest {
    /// The same request as a chat request: `instructions` as the system message, `input`'s
    /// messages, function calls and their outputs as chat turns.
    pub fn to_chat(&self) -> Result<ChatCompletionRequest, ApiError> {
        if self.previous_response_id.is_some() {
            return Err(bad(
                "previous_response_id is not supported: this server keeps no responses \
                 (send the whole conversation in `input`)",
                "previous_response_id",
            ));
        }
        if self.background == Some(true) {
            return Err(bad("background responses are not supported", "background"));
        }
        if self.max_output_tokens == Some(0) {
            return Err(bad(
                "max_output_tokens must be at least 1",
                "max_output_tokens",
            ));
        }
        if self.prompt.is_some() {
            return Err(bad("prompt templates are not supported", "prompt"));
        }
        let mut messages = Vec::new();
        if let Some(i) = &self.instructions {
            messages.push(json!({"role": "system", "content": i}));
        }
        match &self.input {
            Value::String(text) => messages.push(json!({"role": "user", "content": text})),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    input_item(item, i, &mut messages)?;
                }
            }
            _ => return Err(bad("input: expected a string or a list of items", "input")),
        }
        let mut chat = json!({
            "messages": messages,
            "stream": self.stream,
            "max_tokens": self.max_output_tokens,
        });
        let fields = chat.as_object_mut().expect("an object");
        set_present(
            fields,
            [
                ("model", json!(self.model)),
                ("temperature", json!(self.temperature)),
                ("top_p", json!(self.top_p)),
                ("parallel_tool_calls", json!(self.parallel_tool_calls)),
            ],
        );
        if let Some(tools) = &self.tools {
            fields.insert("tools".into(), chat_tools(tools, tool)?);
        }
        if let Some(choice) = &self.tool_choice {
            fields.insert("tool_choice".into(), tool_choice(choice)?);
        }
        if let Some(format) = self.text.as_ref().and_then(|t| t.get("format")) {
            text_format(format, fields)?;
        }
        // As vLLM: logprobs when `include` asks for them, `top_logprobs` alternatives each
        // (checked by the chat request as its own `top_logprobs`).
        if self.wants_logprobs() {
            fields.insert("logprobs".into(), json!(true));
            let top = logprob_count::as_i64(self.top_logprobs.unwrap_or(0));
            fields.insert("top_logprobs".into(), json!(top));
        }
        chat_request(chat)
    }

    pub fn wants_logprobs(&self) -> bool {
        self.include.iter().flatten().any(|i| i == OUTPUT_LOGPROBS)
    }
}

/// Item `i` of `input` as chat messages: a message, a function call (joined to the
/// assistant turn before it), a function call's output, or a reasoning item (dropped, as
/// chat templates drop earlier thinking).
fn input_item(item: &Value, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let field = |name: &str| {
        item.get(name)
            .filter(|v| !v.is_null())
            .ok_or_else(|| bad(format!("{at}: `{name}` is required"), "input"))
    };
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        None | Some("message") => {
            let role = match field("role")?.as_str() {
                Some(r @ ("user" | "assistant" | "system")) => r,
                Some("developer") => "system",
                _ => {
                    return Err(bad(
                        format!("{at}.role: expected user, assistant, system or developer"),
                        "input",
                    ))
                }
            };
            let content = content_text(field("content")?, &format!("{at}.content"))?;
            out.push(json!({"role": role, "content": content}));
        }
        Some("function_call") => {
            let arguments = field("arguments")?;
            let call = json!({
                "id": field("call_id")?, "type": "function",
                "function": {"name": field("name")?, "arguments": arguments},
            });
            match out.last_mut() {
                Some(turn) if turn["role"] == "assistant" => match turn.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => turn["tool_calls"] = json!([call]),
                },
                _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
            }
        }
        Some("function_call_output") => {
            let output = content_text(field("output")?, &format!("{at}.output"))?;
            out.push(json!({"role": "tool", "tool_call_id": field("call_id")?, "content": output}));
        }
        Some("reasoning") => {}
        Some(other) => {
            return Err(bad(
                format!(
                    "{at}: items of type `{other}` are not supported (message, function_call, \
                     function_call_output, reasoning)"
                ),
                "input",
            ))
        }
    }
    Ok(())
}

/// A string, or a list of text parts (`input_text`, `output_text`, `refusal`), as one string.
fn content_text(v: &Value, at: &str) -> Result<String, ApiError> {
    let parts = match v {
        Value::String(s) => return Ok(s.clone()),
        Value::Array(parts) => parts,
        _ => {
            return Err(bad(
                format!("{at}: expected a string or a list of parts"),
                "input",
            ))
        }
    };
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let kind = p.get("type").and_then(Value::as_str);
        let text = match kind {
            Some("input_text" | "output_text" | "text") => p.get("text"),
            Some("refusal") => p.get("refusal"),
            _ => None,
        };
        match text.and_then(Value::as_str) {
            Some(t) => texts.push(t),
            None => {
                return Err(bad(
                    format!(
                        "{at}[{j}]: expected a text part (input_text, output_text), got {}; \
                         this server's models read text",
                        kind.map_or("no `type`".to_string(), |k| format!("`{k}`"))
                    ),
                    "input",
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// A function tool (`{type: "function", name, description, parameters}`) as chat's.
fn tool(t: &Value, i: usize) -> Result<Value, ApiError> {
    let name = t.get("name").and_then(Value::as_str);
    let (Some("function"), Some(name)) = (t.get("type").and_then(Value::as_str), name) else {
        return Err(bad(
            format!("tools[{i}]: only function tools (`type: \"function\"` with a `name`) are supported"),
            "tools",
        ));
    };
    let mut function = json!({"name": name});
    for key in ["description", "parameters"] {
        if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
            function[key] = v.clone();
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

fn tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(s) if ["none", "auto", "required"].contains(&s.as_str()) => {
            Ok(choice.clone())
        }
        _ => match (
            choice.get("type").and_then(Value::as_str),
            choice.get("name"),
        ) {
            (Some("function"), Some(Value::String(name))) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(bad(
                "tool_choice: expected \"none\", \"auto\", \"required\" or {\"type\": \
                 \"function\", \"name\": ...}",
                "tool_choice",
            )),
        },
    }
}

/// `text.format` as chat's `response_format`.
fn text_format(format: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(()),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let Some(schema) = format.get("schema") else {
                return Err(bad(
                    "text.format: a json_schema format needs a `schema`",
                    "text",
                ));
            };
            let mut spec = json!({"name": format.get("name").cloned().unwrap_or(json!("schema")),
                                  "schema": schema});
            if let Some(strict) = format.get("strict") {
                spec["strict"] = strict.clone();
            }
            json!({"type": "json_schema", "json_schema": spec})
        }
        _ => {
            return Err(bad(
                "text.format: expected a format of type text, json_object or json_schema",
                "text",
            ))
        }
    };
    chat.insert("response_format".into(), response_format);
    Ok(())
}
