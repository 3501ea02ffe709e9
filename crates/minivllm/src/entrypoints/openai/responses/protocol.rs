//! OpenAI's Responses request, read into the chat request the chat route runs (as vLLM's
//! and llama-server's do).

use serde::Deserialize;
use serde_json::{json, Value};

use crate::entrypoints::openai::protocol::{
    ApiError, ChatCompletionRequest, ChatMessageIn, ChatTool, CommonParams, FunctionCallIn,
    ToolCallIn,
};
use crate::entrypoints::openai::structured_outputs::{JsonSchemaFormat, ResponseFormat};
use crate::entrypoints::openai::template_kwargs::TemplateKwargs;

use crate::sampling_params::logprob_count;

/// `POST /v1/responses`. Stateless: nothing is stored, so `previous_response_id` is refused
/// (send the conversation in `input`, as `store: false` clients do). `reasoning.effort` is
/// the chat request's `reasoning_effort`; fields that change nothing here (`service_tier`,
/// other `include` values, ...) are accepted and ignored.
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
    /// `{"effort": "low"}`: the chat request's `reasoning_effort`.
    pub reasoning: Option<Value>,
    /// vLLM's extension, as in a chat request.
    pub chat_template_kwargs: Option<TemplateKwargs>,
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
            messages.push(ChatMessageIn::text("system", i.clone()));
        }
        match &self.input {
            Value::String(text) => messages.push(ChatMessageIn::text("user", text.clone())),
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    input_item(item, i, &mut messages)?;
                }
            }
            _ => return Err(bad("input: expected a string or a list of items", "input")),
        }
        let mut chat = ChatCompletionRequest::new(messages);
        chat.max_tokens = self.max_output_tokens;
        chat.parallel_tool_calls = self.parallel_tool_calls;
        chat.common = CommonParams {
            model: self.model.clone(),
            temperature: self.temperature,
            top_p: self.top_p,
            stream: self.stream,
            ..CommonParams::default()
        };
        if let Some(tools) = &self.tools {
            let tools = tools.iter().enumerate().map(|(i, t)| tool(t, i));
            chat.tools = Some(tools.collect::<Result<_, _>>()?);
        }
        if let Some(choice) = &self.tool_choice {
            chat.tool_choice = Some(tool_choice(choice)?);
        }
        if let Some(format) = self.text.as_ref().and_then(|t| t.get("format")) {
            chat.common.structured.response_format = text_format(format)?;
        }
        // As vLLM: logprobs when `include` asks for them, `top_logprobs` alternatives each
        // (checked by the chat request as its own `top_logprobs`).
        if self.wants_logprobs() {
            chat.logprobs = true;
            chat.top_logprobs = Some(self.top_logprobs.unwrap_or(0));
        }
        chat.chat_template_kwargs = self.chat_template_kwargs.clone();
        match self.reasoning.as_ref().and_then(|r| r.get("effort")) {
            None | Some(Value::Null) => {}
            Some(Value::String(effort)) => chat.reasoning_effort = Some(effort.clone()),
            Some(_) => return Err(bad("reasoning.effort: expected a string", "reasoning")),
        }
        Ok(chat)
    }

    pub(crate) fn wants_logprobs(&self) -> bool {
        self.include.iter().flatten().any(|i| i == OUTPUT_LOGPROBS)
    }
}

/// Item `i` of `input` as chat messages: a message, a function call (joined to the
/// assistant turn before it), a function call's output, or a reasoning item (dropped, as
/// chat templates drop earlier thinking).
fn input_item(item: &Value, i: usize, out: &mut Vec<ChatMessageIn>) -> Result<(), ApiError> {
    let at = format!("input[{i}]");
    let field = |name: &str| {
        item.get(name)
            .filter(|v| !v.is_null())
            .ok_or_else(|| bad(format!("{at}: `{name}` is required"), "input"))
    };
    let string = |name: &str| {
        field(name)?
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{at}.{name}: expected a string"), "input"))
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
            out.push(ChatMessageIn::text(role, content));
        }
        Some("function_call") => {
            let call = ToolCallIn {
                id: Some(string("call_id")?),
                function: FunctionCallIn {
                    name: string("name")?,
                    arguments: field("arguments")?.clone(),
                },
            };
            match out.last_mut() {
                Some(turn) if turn.role == "assistant" => {
                    turn.tool_calls.get_or_insert_with(Vec::new).push(call);
                }
                _ => {
                    let mut turn = ChatMessageIn::text("assistant", String::new());
                    turn.tool_calls = Some(vec![call]);
                    out.push(turn);
                }
            }
        }
        Some("function_call_output") => {
            let output = content_text(field("output")?, &format!("{at}.output"))?;
            out.push(ChatMessageIn::tool_result(Some(string("call_id")?), output));
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
fn tool(t: &Value, i: usize) -> Result<ChatTool, ApiError> {
    let name = t.get("name").and_then(Value::as_str);
    let (Some("function"), Some(name)) = (t.get("type").and_then(Value::as_str), name) else {
        return Err(bad(
            format!("tools[{i}]: only function tools (`type: \"function\"` with a `name`) are supported"),
            "tools",
        ));
    };
    ChatTool::function(
        i,
        name,
        t.get("description"),
        t.get("parameters").filter(|p| !p.is_null()).cloned(),
    )
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

/// `text.format` as chat's `response_format` (`None` for plain text).
fn text_format(format: &Value) -> Result<Option<ResponseFormat>, ApiError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let Some(schema) = format.get("schema") else {
                return Err(bad(
                    "text.format: a json_schema format needs a `schema`",
                    "text",
                ));
            };
            let name = match format.get("name") {
                None | Some(Value::Null) => "schema".to_string(),
                Some(Value::String(n)) => n.clone(),
                Some(_) => return Err(bad("text.format.name: expected a string", "text")),
            };
            let strict = match format.get("strict") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => return Err(bad("text.format.strict: expected a boolean", "text")),
            };
            Ok(Some(ResponseFormat::JsonSchema {
                json_schema: JsonSchemaFormat {
                    name: Some(name),
                    description: None,
                    schema: Some(schema.clone()).filter(|s| !s.is_null()),
                    strict,
                },
            }))
        }
        _ => Err(bad(
            "text.format: expected a format of type text, json_object or json_schema",
            "text",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::structured_outputs::ResponseFormat;

    fn read(v: Value) -> Result<ChatCompletionRequest, ApiError> {
        serde_json::from_value::<ResponsesRequest>(v)
            .unwrap()
            .to_chat()
    }

    /// Calls join the assistant turn before them; outputs are `tool` turns; the format, the
    /// logprobs asked for through `include` and the sampling fields land in the chat
    /// request's own fields.
    #[test]
    fn input_items_and_fields_read_as_the_chat_request() {
        let chat = read(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 5, "top_p": 0.9,
            "parallel_tool_calls": false, "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
            "text": {"format": {"type": "json_schema", "name": "w", "strict": true,
                                "schema": {"type": "object"}}},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "reasoning": {"effort": "low"},
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {"role": "assistant", "content": "Calling."},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                {"type": "reasoning", "summary": []},
            ],
        }))
        .unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let calls = chat.messages[2].tool_calls.as_ref().unwrap();
        let ids: Vec<_> = calls.iter().map(|c| c.id.as_deref().unwrap()).collect();
        assert_eq!(ids, ["c1", "c2"]);
        assert_eq!(chat.messages[3].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(chat.max_tokens, Some(5));
        assert_eq!(chat.parallel_tool_calls, Some(false));
        assert_eq!((chat.logprobs, chat.top_logprobs), (true, Some(2)));
        assert_eq!(chat.common.top_p, Some(0.9));
        assert_eq!(chat.reasoning_effort.as_deref(), Some("low"));
        assert_eq!(
            chat.tool_choice,
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        let Some(ResponseFormat::JsonSchema { json_schema }) =
            &chat.common.structured.response_format
        else {
            panic!("{:?}", chat.common.structured.response_format)
        };
        assert_eq!(json_schema.name.as_deref(), Some("w"));
        assert_eq!(json_schema.strict, Some(true));
        // A call with nothing before it opens an assistant turn of its own.
        let chat = read(json!({"input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]}))
        .unwrap();
        assert_eq!(chat.messages[0].role, "assistant");
    }

    #[test]
    fn fields_of_the_wrong_type_are_named() {
        let msg = |v: Value| read(v).unwrap_err().message;
        let call = json!({"input": [
            {"type": "function_call", "call_id": 3, "name": "f", "arguments": "{}"}]});
        assert!(msg(call).contains("input[0].call_id: expected a string"));
        let effort = json!({"input": "x", "reasoning": {"effort": 1}});
        assert!(msg(effort).contains("reasoning.effort: expected a string"));
        let format = json!({"input": "x", "text": {"format": {"type": "json_schema",
                            "schema": {}, "strict": "yes"}}});
        assert!(msg(format).contains("text.format.strict: expected a boolean"));
    }
}
