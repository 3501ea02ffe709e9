//! Mistral's tool calls: text, then the `[TOOL_CALLS]` token and a JSON list of
//! `{"name": ..., "arguments": {...}}` (tokenizers before v11), or `name{...}` after each
//! `[TOOL_CALLS]` (v11 and later, optionally `name[ARGS]{...}`).

use super::json_scan::{skip_ws, value_end};
use super::{calls_in_sequence, content_before, ParsedOutput, ParsedToolCall, ToolParser};
use crate::sampling_params::SamplingParams;

const MARKER: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

#[derive(Debug, Clone, Copy, Default)]
pub struct MistralToolParser;

impl ToolParser for MistralToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        let (content, at) = content_before(text, MARKER, finished);
        let Some(at) = at else {
            return ParsedOutput::content(content);
        };
        let rest = &text[at + MARKER.len()..];
        let calls = match rest.trim_start().strip_prefix('[') {
            Some(list) => calls_in_sequence(list, b",", finished).map(|o| o.tool_calls),
            None => named_calls(rest, finished),
        };
        match calls {
            Some(tool_calls) => ParsedOutput {
                content,
                tool_calls,
                ..ParsedOutput::default()
            },
            None => ParsedOutput::content(text),
        }
    }

    /// `[TOOL_CALLS]` is a special token: it must stay in the text to be seen.
    fn adjust_params(&self, params: &mut SamplingParams) {
        params.skip_special_tokens = false;
    }
}

/// `name{args}[TOOL_CALLS]name{args}...`; finished, `None` if a call does not parse.
fn named_calls(rest: &str, finished: bool) -> Option<Vec<ParsedToolCall>> {
    let mut calls = Vec::new();
    for part in rest.split(MARKER) {
        let Some(brace) = part.find('{') else {
            if finished && !part.trim().is_empty() {
                return None;
            }
            break;
        };
        let name = part[..brace].trim();
        let name = name.strip_suffix(ARGS).unwrap_or(name).trim();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
        let args = &part[skip_ws(part, brace)..];
        let end = value_end(args);
        let args = &args[..end.unwrap_or(args.len())];
        if !valid
            || ((finished || end.is_some())
                && serde_json::from_str::<serde_json::Value>(args).is_err())
        {
            if finished {
                return None;
            }
            break;
        }
        calls.push(ParsedToolCall {
            name: name.to_string(),
            arguments: args.to_string(),
        });
    }
    if finished && calls.is_empty() {
        return None;
    }
    Some(calls)
}
