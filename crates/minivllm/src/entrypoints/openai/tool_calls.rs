//! Tool calling in chat: the request's `tools` and `tool_choice` checked and turned into
//! what the engine runs (the tools given to the chat template, a JSON constraint when the
//! choice forces a call), and the reply's `tool_calls`, whole or streamed in pieces.

use serde_json::{json, Map, Value};

use super::protocol::{ApiError, ChatTool};
use super::reply_events::{Piece, ToolCallOut};
use super::tool_parsers::{ForcedToolParser, ParsedOutput, ToolParser, ToolParserName};
use crate::sampling_params::{SamplingParams, StructuredOutputsParams};
use crate::structured_output::strict_schema::close_objects;

/// The request's `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

impl ToolChoice {
    /// From the JSON field; absent, OpenAI's default: `auto` when there are tools.
    fn from_field(field: Option<&Value>, has_tools: bool) -> Result<Self, ApiError> {
        let bad = || {
            ApiError::bad_request(
                "tool_choice must be \"none\", \"auto\", \"required\" or \
                 {\"type\": \"function\", \"function\": {\"name\": ...}}",
                Some("tool_choice"),
            )
        };
        match field {
            None | Some(Value::Null) if has_tools => Ok(ToolChoice::Auto),
            None | Some(Value::Null) => Ok(ToolChoice::None),
            Some(Value::String(s)) => match s.as_str() {
                "none" => Ok(ToolChoice::None),
                "auto" => Ok(ToolChoice::Auto),
                "required" => Ok(ToolChoice::Required),
                _ => Err(bad()),
            },
            Some(Value::Object(o)) => o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(|n| ToolChoice::Named(n.to_string()))
                .ok_or_else(bad),
            Some(_) => Err(bad()),
        }
    }
}

/// The server's `--enable-auto-tool-choice` and `--tool-call-parser`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolCallConfig {
    pub enable_auto_tool_choice: bool,
    pub parser: Option<ToolParserName>,
}

/// How a chat request uses tools.
#[derive(Debug)]
pub(crate) struct ToolUse {
    /// The tools as the chat template gets them (as the client sent them).
    pub template_tools: Vec<Value>,
    /// Reads the reply's calls; `None` when the reply is plain text.
    pub parser: Option<Box<dyn ToolParser>>,
    /// The constraint calls need: only a call (`required`, a named function), or calls that
    /// always parse once begun (`auto` with the Hermes parser).
    pub constraint: Option<StructuredOutputsParams>,
    /// A reply with calls finishes with `tool_calls` (not for a named function, as OpenAI).
    pub finish_as_tool_calls: bool,
}

impl ToolUse {
    /// Checks `tools`, `tool_choice` and `parallel_tool_calls` (with vLLM's messages where
    /// it has them) against each other and the server's settings.
    pub(crate) fn from_request(
        tools: Option<&[ChatTool]>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<bool>,
        structured: bool,
        config: &ToolCallConfig,
    ) -> Result<Self, ApiError> {
        let tools = tools.unwrap_or_default();
        let choice = ToolChoice::from_field(tool_choice, !tools.is_empty())?;
        for (i, t) in tools.iter().enumerate() {
            check_tool(t, i, tools)?;
        }
        if tools.is_empty() && choice != ToolChoice::None {
            return Err(ApiError::bad_request(
                "When using `tool_choice`, `tools` must be set.",
                Some("tool_choice"),
            ));
        }
        let template_tools = tools
            .iter()
            .map(|t| {
                let mut function = Map::new();
                function.insert("name".into(), json!(t.function.name));
                if let Some(d) = &t.function.description {
                    function.insert("description".into(), json!(d));
                }
                if let Some(p) = &t.function.parameters {
                    function.insert("parameters".into(), p.clone());
                }
                json!({"type": "function", "function": function})
            })
            .collect();
        let forced_with_format = || {
            ApiError::bad_request(
                "tool_choice \"required\" or a named function constrains the reply to a tool \
                 call, and cannot be combined with response_format, structured_outputs or \
                 guided_* in one request",
                Some("tool_choice"),
            )
        };
        let (parser, constraint, finish_as_tool_calls): (Option<Box<dyn ToolParser>>, _, _) =
            match &choice {
                ToolChoice::None => (None, None, false),
                ToolChoice::Auto => {
                    let parser = config.parser.filter(|_| config.enable_auto_tool_choice);
                    let Some(parser) = parser else {
                        return Err(ApiError::bad_request(
                            "\"auto\" tool choice requires --enable-auto-tool-choice and \
                             --tool-call-parser to be set",
                            Some("tool_choice"),
                        ));
                    };
                    // A request's own constraint wins; otherwise Hermes calls are held to
                    // the tools once the model opens one.
                    let constraint = match parser {
                        ToolParserName::Hermes if !structured => Some(StructuredOutputsParams {
                            structural_tag: Some(hermes_auto_tag(tools)?),
                            ..Default::default()
                        }),
                        _ => None,
                    };
                    (Some(parser.parser()), constraint, true)
                }
                ToolChoice::Required => {
                    if structured {
                        return Err(forced_with_format());
                    }
                    let schema = required_schema(tools, parallel_tool_calls == Some(false))?;
                    (
                        Some(Box::new(ForcedToolParser::Required)),
                        Some(forced_params(schema)),
                        true,
                    )
                }
                ToolChoice::Named(name) => {
                    if structured {
                        return Err(forced_with_format());
                    }
                    let Some(tool) = tools.iter().find(|t| &t.function.name == name) else {
                        return Err(ApiError::bad_request(
                            format!("Tool '{name}' has not been passed in `tools`."),
                            Some("tool_choice"),
                        ));
                    };
                    (
                        Some(Box::new(ForcedToolParser::Named(name.clone()))),
                        Some(forced_params(parameters_schema(tool))),
                        false,
                    )
                }
            };
        Ok(Self {
            template_tools,
            parser,
            constraint,
            finish_as_tool_calls,
        })
    }

    /// The request's sampling parameters as calls need them.
    pub(crate) fn adjust_params(&self, params: &mut SamplingParams) {
        if let Some(constraint) = &self.constraint {
            params.structured_outputs = Some(constraint.clone());
        }
        if let Some(parser) = &self.parser {
            parser.adjust_params(params);
        }
    }
}

fn check_tool(t: &ChatTool, i: usize, tools: &[ChatTool]) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m, Some("tools")));
    if t.kind != "function" {
        return bad(format!(
            "tools[{i}].type must be \"function\", got {:?}",
            t.kind
        ));
    }
    if t.function.name.is_empty() {
        return bad(format!("tools[{i}].function.name must not be empty"));
    }
    if tools[..i]
        .iter()
        .any(|o| o.function.name == t.function.name)
    {
        return bad(format!(
            "tools[{i}]: a tool named {:?} is given twice",
            t.function.name
        ));
    }
    match &t.function.parameters {
        None | Some(Value::Object(_)) => Ok(()),
        Some(_) => bad(format!(
            "tools[{i}].function.parameters must be a JSON schema object"
        )),
    }
}

/// The constraint of a forced call. As OpenAI's `strict` tools: objects take only the
/// properties their schema lists (unless it says otherwise), and JSON comes without free
/// whitespace; small models otherwise fill a call with invented keys or blank lines
/// (SmolLM2 does, to `max_tokens`).
fn forced_params(mut schema: Value) -> StructuredOutputsParams {
    close_objects(&mut schema);
    StructuredOutputsParams {
        disable_any_whitespace: true,
        ..StructuredOutputsParams::json_schema(schema)
    }
}

/// A tool's arguments schema; no schema means an empty object, as vLLM generates `{}`.
fn parameters_schema(tool: &ChatTool) -> Value {
    match &tool.function.parameters {
        Some(p) if p.as_object().is_some_and(|o| !o.is_empty()) => p.clone(),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// vLLM's schema for `tool_choice: "required"`: a list of at least one
/// `{"name": <a tool>, "parameters": <its arguments>}`.
fn required_schema(tools: &[ChatTool], single: bool) -> Result<Value, ApiError> {
    let (variants, defs) = call_variants(tools, "parameters")?;
    let mut schema = json!({
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": variants},
    });
    if single {
        schema["maxItems"] = json!(1);
    }
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

/// For `tool_choice: "auto"` with the Hermes parser: free text, but what follows a
/// `<tool_call>` the model writes must be a call to one of the tools, closed by
/// `</tool_call>` (a `structural_tag`, as llama.cpp's lazy grammar), so a call that starts
/// always parses.
fn hermes_auto_tag(tools: &[ChatTool]) -> Result<Value, ApiError> {
    let (variants, defs) = call_variants(tools, "arguments")?;
    // Spaced as Python's json.dumps, as Qwen's training data: no runs of free whitespace.
    let mut schema = json!({"type": "object", "anyOf": variants, "x-guidance": {
        "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}});
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    close_objects(&mut schema);
    Ok(json!({
        "type": "structural_tag",
        "triggers": ["<tool_call>"],
        "structures": [{"begin": "<tool_call>", "schema": schema, "end": "</tool_call>"}],
    }))
}

/// One object schema per tool, `{"name": <its name>, <args_key>: <its arguments>}`, and
/// the tools' `$defs`, moved to the top so their `$ref`s still resolve.
fn call_variants(
    tools: &[ChatTool],
    args_key: &str,
) -> Result<(Vec<Value>, Map<String, Value>), ApiError> {
    let mut defs = Map::new();
    let mut variants = Vec::with_capacity(tools.len());
    for t in tools {
        let mut params = parameters_schema(t);
        if let Some(Value::Object(d)) = params.as_object_mut().and_then(|p| p.remove("$defs")) {
            for (name, schema) in d {
                match defs.get(&name) {
                    Some(existing) if *existing != schema => {
                        return Err(ApiError::bad_request(
                            format!(
                                "Tool definition '{name}' has multiple schemas, which is not \
                                 supported."
                            ),
                            Some("tools"),
                        ))
                    }
                    _ => {
                        defs.insert(name, schema);
                    }
                }
            }
        }
        variants.push(json!({
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                args_key: params,
            },
            "required": ["name", args_key],
            "additionalProperties": false,
        }));
    }
    Ok((variants, defs))
}

/// A fresh call id, in vLLM's form.
pub(crate) fn tool_call_id() -> String {
    format!("chatcmpl-tool-{:032x}", rand::random::<u128>())
}

/// A finished output's reply as the parsers read it: the thinking (when the model thought),
/// the answer (`None` when only calls came back, or only thinking) and the calls, each with a
/// fresh id.
pub(crate) fn finished_reply(
    parsed: &ParsedOutput,
) -> (Option<String>, Option<String>, Vec<ToolCallOut>) {
    let thought = (!parsed.reasoning.is_empty()).then(|| parsed.reasoning.clone());
    let content = (!parsed.content.trim().is_empty()
        || (parsed.tool_calls.is_empty() && parsed.reasoning.is_empty()))
    .then(|| parsed.content.clone());
    let calls = parsed
        .tool_calls
        .iter()
        .map(|c| ToolCallOut {
            id: tool_call_id(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        })
        .collect();
    (thought, content, calls)
}

/// What one choice of a stream has sent: the parsed reply so far, so each delta carries
/// only what is new.
#[derive(Debug, Default)]
pub(crate) struct ReplyStream {
    reasoning: usize,
    content: usize,
    /// Per call sent: how much of its arguments.
    calls: Vec<usize>,
}

impl ReplyStream {
    /// The pieces (thinking, answer, calls begun and their arguments) the newly parsed
    /// reply adds, in that order; empty when it adds nothing.
    pub fn delta(&mut self, parsed: &ParsedOutput) -> Vec<Piece> {
        let mut pieces = Vec::new();
        for (text, sent, piece) in [
            (
                &parsed.reasoning,
                &mut self.reasoning,
                Piece::Reasoning as fn(String) -> Piece,
            ),
            (&parsed.content, &mut self.content, Piece::Text),
        ] {
            // Text that went back (a final reading unlike the stream's) is not sent again.
            if let Some(new) = text.get(*sent..).filter(|s| !s.is_empty()) {
                pieces.push(piece(new.to_string()));
                *sent = text.len();
            }
        }
        for (index, call) in parsed.tool_calls.iter().enumerate() {
            if index == self.calls.len() {
                pieces.push(Piece::CallStart {
                    index,
                    id: tool_call_id(),
                    name: call.name.clone(),
                });
                self.calls.push(0);
            }
            let sent = &mut self.calls[index];
            if let Some(new) = call.arguments.get(*sent..).filter(|s| !s.is_empty()) {
                pieces.push(Piece::CallArguments {
                    index,
                    text: new.to_string(),
                });
                *sent = call.arguments.len();
            }
        }
        pieces
    }

    /// Whether any call has been sent.
    pub fn called(&self) -> bool {
        !self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::tool_parsers::ParsedToolCall;

    fn tools(v: Value) -> Vec<ChatTool> {
        serde_json::from_value(v).unwrap()
    }

    fn weather() -> Vec<ChatTool> {
        tools(json!([
            {"type": "function", "function": {"name": "get_weather",
             "parameters": {"type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
                            "$defs": {"City": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "get_time"}},
        ]))
    }

    const AUTO: ToolCallConfig = ToolCallConfig {
        enable_auto_tool_choice: true,
        parser: Some(ToolParserName::Hermes),
    };

    fn setup(choice: Value, config: &ToolCallConfig) -> Result<ToolUse, ApiError> {
        let t = weather();
        ToolUse::from_request(Some(&t), Some(&choice), None, false, config)
    }

    #[test]
    fn choices_as_vllm_reads_them() {
        let t = weather();
        let auto = ToolUse::from_request(Some(&t), None, None, false, &AUTO).unwrap();
        assert!(auto.parser.is_some() && auto.finish_as_tool_calls);
        let tag = auto.constraint.unwrap().structural_tag.unwrap();
        assert_eq!(tag["triggers"], json!(["<tool_call>"]));
        assert_eq!(
            tag["structures"][0]["schema"]["$defs"]["City"],
            json!({"type": "string"})
        );
        // The request's own constraint wins over the tools'.
        let own = ToolUse::from_request(Some(&t), None, None, true, &AUTO).unwrap();
        assert!(own.constraint.is_none() && own.parser.is_some());
        assert_eq!(auto.template_tools.len(), 2);
        let none = setup(json!("none"), &AUTO).unwrap();
        assert!(none.parser.is_none() && none.constraint.is_none());
        assert_eq!(none.template_tools.len(), 2);
        let named = setup(
            json!({"type": "function", "function": {"name": "get_time"}}),
            &AUTO,
        )
        .unwrap();
        assert!(!named.finish_as_tool_calls);
        let named = named.constraint.unwrap();
        assert_eq!(
            named.json,
            Some(json!({"type": "object", "properties": {}, "additionalProperties": false}))
        );
        assert!(named.disable_any_whitespace);
        let required = setup(json!("required"), &ToolCallConfig::default()).unwrap();
        let schema = required.constraint.unwrap().json.unwrap();
        assert_eq!(schema["minItems"], 1);
        assert_eq!(schema["$defs"]["City"], json!({"type": "string"}));
        assert!(schema["items"]["anyOf"][0]["properties"]["parameters"]
            .get("$defs")
            .is_none());
    }

    #[test]
    fn bad_choices_get_vllms_messages() {
        let msg = |r: Result<ToolUse, ApiError>| r.unwrap_err().message;
        assert!(msg(setup(json!("auto"), &ToolCallConfig::default()))
            .contains("--enable-auto-tool-choice"));
        assert!(msg(setup(
            json!({"type": "function", "function": {"name": "nope"}}),
            &AUTO
        ))
        .contains("Tool 'nope' has not been passed"));
        assert!(msg(setup(json!("sometimes"), &AUTO)).contains("tool_choice must be"));
        assert!(msg(ToolUse::from_request(
            None,
            Some(&json!("required")),
            None,
            false,
            &AUTO
        ))
        .contains("`tools` must be set"));
        let t = weather();
        assert!(msg(ToolUse::from_request(
            Some(&t),
            Some(&json!("required")),
            None,
            true,
            &AUTO
        ))
        .contains("cannot be combined"));
        let twice = tools(json!([{"function": {"name": "a"}}, {"function": {"name": "a"}}]));
        assert!(msg(ToolUse::from_request(
            Some(&twice),
            None,
            None,
            false,
            &AUTO
        ))
        .contains("given twice"));
        let bad = tools(json!([{"function": {"name": "a", "parameters": [1]}}]));
        assert!(
            msg(ToolUse::from_request(Some(&bad), None, None, false, &AUTO))
                .contains("parameters must be a JSON schema object")
        );
    }

    #[test]
    fn a_stream_sends_each_call_once_then_its_arguments_in_pieces() {
        let mut s = ReplyStream::default();
        let call = |args: &str| ParsedToolCall {
            name: "f".into(),
            arguments: args.into(),
        };
        let d = s.delta(&ParsedOutput {
            content: "Hi".into(),
            tool_calls: vec![call("{\"a\"")],
            ..ParsedOutput::default()
        });
        let [Piece::Text(text), Piece::CallStart { index: 0, name, .. }, Piece::CallArguments {
            index: 0,
            text: args,
        }] = &d[..]
        else {
            panic!("{d:?}")
        };
        assert_eq!((&text[..], &name[..], &args[..]), ("Hi", "f", "{\"a\""));
        let d = s.delta(&ParsedOutput {
            content: "Hi".into(),
            tool_calls: vec![call("{\"a\": 1}")],
            ..ParsedOutput::default()
        });
        assert_eq!(
            d,
            [Piece::CallArguments {
                index: 0,
                text: ": 1}".into()
            }]
        );
        assert!(s.called());
        assert!(s
            .delta(&ParsedOutput {
                content: "Hi".into(),
                tool_calls: vec![call("{\"a\": 1}")],
                ..ParsedOutput::default()
            })
            .is_empty());
    }
}
