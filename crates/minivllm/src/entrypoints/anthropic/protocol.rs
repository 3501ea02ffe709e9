//! Anthropic's Messages request, read into the chat request the engine's chat route runs
//! (as vLLM's `entrypoints/anthropic` does), and Anthropic's error envelope.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::entrypoints::openai::protocol::{
    ApiError, ChatCompletionRequest, ChatMessageIn, ChatTool, CommonParams, FunctionCallIn,
    StopField, ToolCallIn,
};
use crate::entrypoints::openai::template_kwargs::TemplateKwargs;

/// `POST /v1/messages` (and `/v1/messages/count_tokens`, which has no `max_tokens`).
/// `thinking` turns the template's thinking on or off (below); fields the SDK sends that
/// change nothing here (`metadata`, `service_tier`, ...) are accepted and ignored, as vLLM
/// does.
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
    /// `{"type": "enabled" | "disabled" | "adaptive", "budget_tokens": n}`.
    pub thinking: Option<Value>,
    /// vLLM's extension, as in a chat request.
    pub chat_template_kwargs: Option<TemplateKwargs>,
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
            messages.push(ChatMessageIn::text("system", text_of(system, "system")?));
        }
        for (i, m) in self.messages.iter().enumerate() {
            message(m, i, &mut messages)?;
        }
        let prefill = self.messages.last().and_then(|m| m.get("role")) == Some(&json!("assistant"));
        let mut chat = ChatCompletionRequest::new(messages);
        chat.max_tokens = max_tokens;
        chat.add_generation_prompt = !prefill;
        chat.continue_final_message = prefill;
        chat.common = CommonParams {
            model: self.model.clone(),
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone().map(StopField::Many),
            stream: self.stream,
            ..CommonParams::default()
        };
        if let Some(tools) = &self.tools {
            let tools = tools.iter().enumerate().map(|(i, t)| tool(t, i));
            chat.tools = Some(tools.collect::<Result<_, _>>()?);
        }
        if let Some(choice) = &self.tool_choice {
            tool_choice(choice, &mut chat)?;
        }
        chat.chat_template_kwargs = self.chat_template_kwargs.clone();
        self.thinking(&mut chat)?;
        Ok(chat)
    }

    /// `thinking.type`: `disabled` is `reasoning_effort: "none"` (vLLM's reading: templates
    /// that read `enable_thinking` turn it off); `enabled` sets `enable_thinking` unless the
    /// request's own `chat_template_kwargs` do (vLLM leaves it to the template's default,
    /// which for Gemma 4 is off, so a client asking for thinking would get none); `adaptive`
    /// leaves it to the template. The budget is not enforced.
    fn thinking(&self, chat: &mut ChatCompletionRequest) -> Result<(), ApiError> {
        let Some(thinking) = self.thinking.as_ref().filter(|t| !t.is_null()) else {
            return Ok(());
        };
        match thinking.get("type").and_then(Value::as_str) {
            Some("disabled") => chat.reasoning_effort = Some("none".into()),
            Some("enabled") => {
                let kwargs = chat
                    .chat_template_kwargs
                    .get_or_insert_with(Default::default);
                kwargs.entry("enable_thinking").or_insert(true.into());
            }
            Some("adaptive") => {}
            _ => {
                return Err(bad(
                    "thinking.type: expected \"enabled\", \"disabled\" or \"adaptive\"",
                    "thinking",
                ))
            }
        }
        Ok(())
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
fn message(m: &Value, i: usize, out: &mut Vec<ChatMessageIn>) -> Result<(), ApiError> {
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
            out.push(ChatMessageIn::text(role, text.clone()));
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
        let string = |name: &str| {
            field(name)?
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(format!("{at}.{name}: expected a string"), "messages"))
        };
        // An id may be null (a client that lost it): the chat turn then has none.
        let id = |name: &str| match field(name)? {
            Value::Null => Ok(None),
            _ => string(name).map(Some),
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
                calls.push(ToolCallIn {
                    id: id("id")?,
                    function: FunctionCallIn {
                        name: string("name")?,
                        arguments: Value::String(input.to_string()),
                    },
                });
            }
            (Some("tool_result"), "user") => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"))?,
                };
                out.push(ChatMessageIn::tool_result(id("tool_use_id")?, content));
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
        let mut turn = ChatMessageIn::text(role, texts.join("\n"));
        turn.tool_calls = Some(calls).filter(|c| !c.is_empty());
        out.push(turn);
    }
    Ok(())
}

/// Tool `i` (`name`, `description`, `input_schema`) as an OpenAI function.
fn tool(t: &Value, i: usize) -> Result<ChatTool, ApiError> {
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
    // A null schema is a tool without arguments.
    let parameters = Some(schema.clone()).filter(|s| !s.is_null());
    ChatTool::function(i, name, t.get("description"), parameters)
}

/// `tool_choice` as OpenAI's: `auto`, `any` (required), `tool` (a named function), `none`;
/// `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn tool_choice(choice: &Value, chat: &mut ChatCompletionRequest) -> Result<(), ApiError> {
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
    chat.tool_choice = Some(openai);
    if choice.get("disable_parallel_tool_use") == Some(&json!(true)) {
        chat.parallel_tool_calls = Some(false);
    }
    Ok(())
}

/// Anthropic's error `type` for an HTTP status.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
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
pub(crate) fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// Rewrites every error of the Messages routes (whichever layer refused the request: the
/// API key, the body's size, its JSON, the handler) into Anthropic's envelope, whose `type`
/// names the SDK's exception.
pub(crate) async fn anthropic_errors(req: Request, next: Next) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::protocol::MessageContent;

    fn read(v: Value) -> Result<ChatCompletionRequest, ApiError> {
        serde_json::from_value::<MessagesRequest>(v)
            .unwrap()
            .to_chat(true)
    }

    fn text(m: &ChatMessageIn) -> &str {
        match &m.content {
            Some(MessageContent::Text(t)) => t,
            other => panic!("{other:?}"),
        }
    }

    /// A conversation with a call and its result, a continued final turn and every mapped
    /// field, read into the chat request's own types.
    #[test]
    fn a_conversation_reads_as_the_chat_request() {
        let chat = read(json!({
            "model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}],
            "temperature": 0.5, "top_k": 4, "stop_sequences": ["END"], "stream": true,
            "tools": [{"name": "get_weather", "description": "Weather.",
                       "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "..."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Rain."}]},
                {"role": "assistant", "content": "It"},
            ],
        }))
        .unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
        assert_eq!(text(&chat.messages[0]), "Be brief.");
        let call = &chat.messages[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.id.as_deref(), Some("toolu_1"));
        assert_eq!(call.function.name, "get_weather");
        assert_eq!(call.function.arguments, json!("{\"city\":\"Oslo\"}"));
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(text(&chat.messages[3]), "Rain.");
        assert!(chat.continue_final_message && !chat.add_generation_prompt);
        assert_eq!(chat.max_tokens, Some(9));
        let c = &chat.common;
        assert_eq!(
            (c.model.as_deref(), c.temperature, c.top_k),
            (Some("m"), Some(0.5), Some(4))
        );
        assert!(c.stream);
        assert!(matches!(&c.stop, Some(StopField::Many(s)) if s == &["END"]));
        let tools = chat.tools.unwrap();
        assert_eq!(tools[0].function.name, "get_weather");
        assert_eq!(tools[0].function.description.as_deref(), Some("Weather."));
        assert_eq!(chat.tool_choice, Some(json!("required")));
        assert_eq!(chat.parallel_tool_calls, Some(false));
    }

    #[test]
    fn fields_of_the_wrong_type_are_named() {
        let msg = |v: Value| read(v).unwrap_err().message;
        let call = |id: Value| {
            json!({"max_tokens": 1, "messages": [{"role": "assistant", "content": [
                {"type": "tool_use", "id": id, "name": "f", "input": {}}]}]})
        };
        assert!(msg(call(json!(7))).contains("messages[0].content[0].id: expected a string"));
        let tools = json!({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}],
                           "tools": [{"name": "f", "input_schema": {}, "description": 1}]});
        assert!(msg(tools).contains("tools[0].description: expected a string"));
    }

    /// `thinking` as vLLM reads it (disabled: effort `none`), and enabled as the template's
    /// `enable_thinking` unless the request's own kwargs say otherwise.
    #[test]
    fn thinking_sets_the_templates_variables() {
        let with = |extra: Value| {
            let mut v = json!({"max_tokens": 9, "messages": [{"role": "user", "content": "x"}]});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            read(v)
        };
        let chat = with(json!({"thinking": {"type": "disabled"}})).unwrap();
        assert_eq!(chat.reasoning_effort.as_deref(), Some("none"));
        let kwargs = chat.template_kwargs(&Default::default());
        assert_eq!(kwargs["enable_thinking"], json!(false));
        let chat = with(json!({"thinking": {"type": "enabled", "budget_tokens": 4}})).unwrap();
        assert_eq!(
            chat.template_kwargs(&Default::default())["enable_thinking"],
            json!(true)
        );
        let own = json!({"thinking": {"type": "enabled"},
                         "chat_template_kwargs": {"enable_thinking": false, "x": 1}});
        let kwargs = with(own).unwrap().template_kwargs(&Default::default());
        assert_eq!(
            (kwargs["enable_thinking"].clone(), kwargs["x"].clone()),
            (json!(false), json!(1))
        );
        let adaptive = with(json!({"thinking": {"type": "adaptive"}})).unwrap();
        assert!(adaptive.template_kwargs(&Default::default()).is_empty());
        let err = with(json!({"thinking": {"type": "always"}})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("thinking"));
    }

    /// Nulls read as the chat request's absent fields, as they did through chat's JSON.
    #[test]
    fn null_ids_and_schemas_are_absent() {
        let chat = read(json!({
            "max_tokens": 1,
            "tools": [{"name": "now", "input_schema": null}],
            "messages": [
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": null, "name": "now", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": null, "content": "noon"}]},
            ],
        }))
        .unwrap();
        assert_eq!(chat.tools.unwrap()[0].function.parameters, None);
        assert_eq!(chat.messages[0].tool_calls.as_ref().unwrap()[0].id, None);
        assert_eq!(chat.messages[1].tool_call_id, None);
    }
}
