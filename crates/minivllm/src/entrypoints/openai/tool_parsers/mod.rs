//! Tool calls read out of generated text, as vLLM's `--tool-call-parser` does: each model
//! family writes its calls in its own format (Hermes' `<tool_call>{json}</tool_call>`,
//! Llama 3's bare JSON, Mistral's `[TOOL_CALLS][...]`, Python call syntax, gpt-oss's
//! harmony messages to `functions.NAME`, Gemma 4's `<|tool_call>call:NAME{...}`).
//!
//! A parser reads the whole text generated so far, so a stream and a complete reply are read
//! the same way. While the text grows, what a parser returns only grows too (content and
//! each call's arguments extend what it returned before), so a stream can send the
//! difference; text that may turn out to start a call is held back until it is clear.

mod gemma4;
mod hermes;
pub(crate) mod json_scan;
mod llama3_json;
mod mistral;
mod openai;
mod pythonic;

use std::fmt::Debug;

use crate::reasoning::{PromptThinking, ReasoningParserName};
use crate::sampling_params::SamplingParams;
use json_scan::{object_members, object_sequence};

pub use gemma4::Gemma4ToolParser;
pub use hermes::HermesToolParser;
pub use llama3_json::Llama3JsonToolParser;
pub use mistral::MistralToolParser;
pub use openai::OpenAiToolParser;
pub use pythonic::PythonicToolParser;

/// One call as read so far.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedToolCall {
    pub name: String,
    /// The arguments as JSON text (an object once complete).
    pub arguments: String,
}

/// Generated text split into what the model said and the calls it made (and, with a
/// reasoning parser, what it thought first).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// The thinking a reasoning parser split off (`reasoning_content`); empty without one.
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ParsedToolCall>,
}

impl ParsedOutput {
    pub fn content(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            ..Self::default()
        }
    }
}

pub trait ToolParser: Send + Sync + Debug {
    /// Reads the text generated so far; `finished` once no more will come. Unfinished, the
    /// result only grows with the text (see the module's comment); finished, text that
    /// does not parse as calls is returned as content, as vLLM does.
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput;

    /// Request settings the format needs (e.g. special tokens kept in the text when the
    /// format's markers are special tokens).
    fn adjust_params(&self, _params: &mut SamplingParams) {}

    /// The reasoning format whose markers the calls are written among (harmony's, Gemma 4's):
    /// it reads where the prompt leaves the thinking even with no `--reasoning-parser`.
    fn reply_format(&self) -> Option<ReasoningParserName> {
        None
    }

    /// For formats whose calls sit beside the thinking (harmony's messages, Gemma 4's
    /// blocks): the whole reply read at once, thinking included, given where the prompt left
    /// it. `None` for parsers that read the answer a reasoning parser leaves.
    fn parse_whole_reply(
        &self,
        _text: &str,
        _prompt: PromptThinking,
        _finished: bool,
    ) -> Option<ParsedOutput> {
        None
    }
}

/// vLLM's `--tool-call-parser` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParserName {
    Hermes,
    Llama3Json,
    Mistral,
    Pythonic,
    OpenAi,
    Gemma4,
}

impl ToolParserName {
    pub const ALL: [ToolParserName; 6] = [
        ToolParserName::Hermes,
        ToolParserName::Llama3Json,
        ToolParserName::Mistral,
        ToolParserName::Pythonic,
        ToolParserName::OpenAi,
        ToolParserName::Gemma4,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolParserName::Hermes => "hermes",
            ToolParserName::Llama3Json => "llama3_json",
            ToolParserName::Mistral => "mistral",
            ToolParserName::Pythonic => "pythonic",
            ToolParserName::OpenAi => "openai",
            ToolParserName::Gemma4 => "gemma4",
        }
    }

    pub fn parser(self) -> Box<dyn ToolParser> {
        match self {
            ToolParserName::Hermes => Box::new(HermesToolParser),
            ToolParserName::Llama3Json => Box::new(Llama3JsonToolParser),
            ToolParserName::Mistral => Box::new(MistralToolParser),
            ToolParserName::Pythonic => Box::new(PythonicToolParser),
            ToolParserName::OpenAi => Box::new(OpenAiToolParser),
            ToolParserName::Gemma4 => Box::new(Gemma4ToolParser),
        }
    }

    /// The format a chat template teaches its model, read from the markers it writes;
    /// `None` when it shows none of them (no tools in the template, or a format not here).
    pub fn detect(chat_template: &str) -> Option<Self> {
        if chat_template.contains("<|channel|>") {
            Some(ToolParserName::OpenAi)
        } else if chat_template.contains("<|tool_call>") {
            Some(ToolParserName::Gemma4)
        } else if chat_template.contains("<tool_call>") {
            Some(ToolParserName::Hermes)
        } else if chat_template.contains("[TOOL_CALLS]") {
            Some(ToolParserName::Mistral)
        } else if chat_template.contains("<|python_tag|>") || chat_template.contains("ipython") {
            Some(ToolParserName::Llama3Json)
        } else {
            None
        }
    }
}

impl std::str::FromStr for ToolParserName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        // vLLM's `llama3_json` also answers to `llama4_json`'s older alias `llama`.
        match s {
            "llama" => return Ok(ToolParserName::Llama3Json),
            "hermes2_pro" => return Ok(ToolParserName::Hermes),
            _ => {}
        }
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown tool call parser {s:?}; choose one of {}",
                    names.join(", ")
                )
            })
    }
}

/// What a request's `tool_choice` of `required` or a named function makes the model write:
/// JSON constrained by the tools' schemas (see `entrypoints::openai::tools`), read back here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ForcedToolParser {
    /// The output is the named function's arguments object.
    Named(String),
    /// The output is a list of `{"name": ..., "parameters": {...}}`.
    Required,
}

impl ToolParser for ForcedToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        match self {
            ForcedToolParser::Named(name) => {
                // Trailing whitespace is held back: it may be the end of the output.
                let args = text.trim();
                ParsedOutput {
                    tool_calls: vec![ParsedToolCall {
                        name: name.clone(),
                        arguments: args.to_string(),
                    }],
                    ..ParsedOutput::default()
                }
            }
            ForcedToolParser::Required => {
                let body = text.trim_start();
                let Some(list) = body.strip_prefix('[') else {
                    return if finished {
                        ParsedOutput::content(text)
                    } else {
                        ParsedOutput::default()
                    };
                };
                calls_in_sequence(list, b",", finished)
                    .unwrap_or_else(|| ParsedOutput::content(text))
            }
        }
    }
}

/// The calls written as JSON objects one after another (separated by `separators`), each
/// `{"name": ..., "arguments" | "parameters": ...}`. Finished, `None` when an object does
/// not parse as a call.
fn calls_in_sequence(s: &str, separators: &[u8], finished: bool) -> Option<ParsedOutput> {
    let mut out = ParsedOutput::default();
    for (start, end) in object_sequence(s, separators) {
        // Checked only when finished: a call a stream has sent cannot be taken back.
        let obj = &s[start..end.unwrap_or(s.len())];
        match call_from_object(obj, finished) {
            Some(call) => out.tool_calls.push(call),
            None if finished => return None,
            None => break,
        }
    }
    if finished && out.tool_calls.is_empty() {
        return None;
    }
    Some(out)
}

/// A call read from the (possibly unfinished) object `obj`; `None` until its name is known,
/// or, once `complete`, when it is not a call.
fn call_from_object(obj: &str, complete: bool) -> Option<ParsedToolCall> {
    if complete {
        let value: serde_json::Value = serde_json::from_str(obj).ok()?;
        value.get("name")?.as_str()?;
    }
    let (members, _) = object_members(obj);
    let member = |keys: &[&str]| members.iter().find(|m| keys.contains(&m.key.as_str()));
    let name = member(&["name"])?;
    let name: String = serde_json::from_str(&obj[name.start..name.end?]).ok()?;
    let arguments = match member(&["arguments", "parameters"]) {
        None if complete => "{}".to_string(),
        None => String::new(),
        Some(m) => {
            let raw = &obj[m.start..m.end.unwrap_or(obj.len())];
            match (m.end, raw.as_bytes()[0]) {
                // Some models write the arguments as a string of JSON: its text, once whole.
                (Some(_), b'"') => serde_json::from_str::<String>(raw).ok()?,
                (None, b'"') => String::new(),
                _ => raw.to_string(),
            }
        }
    };
    Some(ParsedToolCall { name, arguments })
}

/// `text` up to `marker`; unfinished and without it, less any tail that could be the
/// marker's beginning.
fn content_before(text: &str, marker: &str, finished: bool) -> (String, Option<usize>) {
    if let Some(at) = text.find(marker) {
        return (text[..at].to_string(), Some(at));
    }
    if finished {
        return (text.to_string(), None);
    }
    let held = (1..marker.len())
        .rev()
        .find(|&k| text.ends_with(&marker[..k]))
        .unwrap_or(0);
    (text[..text.len() - held].to_string(), None)
}

#[cfg(test)]
mod tests;
