//! Hermes' format, which Qwen2.5 and Qwen3 are trained on:
//! `text <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` once per call.
//!
//! Small models often leave the tags out and answer with the bare object (Qwen2.5-Coder-0.5B
//! does, greedily, for a plain weather question); as llama.cpp does, a reply that is only
//! such objects (in a code fence or not) is read as calls too.

use super::json_scan::{object_members, object_sequence, skip_ws};
use super::{call_from_object, content_before, ParsedOutput, ToolParser};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

#[derive(Debug, Clone, Copy, Default)]
pub struct HermesToolParser;

impl ToolParser for HermesToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        let (content, first) = content_before(text, START, finished);
        let mut out = ParsedOutput::content(content);
        let Some(mut at) = first else {
            return bare_calls(text, finished).unwrap_or(out);
        };
        // Text between or after calls is dropped, as vLLM drops it.
        loop {
            let body_start = at + START.len();
            let (body, closed, next) = match text[body_start..].find(END) {
                Some(len) => (
                    &text[body_start..body_start + len],
                    true,
                    text[body_start + len..]
                        .find(START)
                        .map(|s| body_start + len + s),
                ),
                None => (&text[body_start..], false, None),
            };
            let body = &body[skip_ws(body, 0)..];
            let body = if closed || finished {
                body.trim_end()
            } else {
                body
            };
            // Checked only when finished: a call a stream has sent cannot be taken back.
            match call_from_object(body, finished) {
                Some(call) => out.tool_calls.push(call),
                None if finished => return ParsedOutput::content(text),
                None => break,
            }
            match next {
                Some(n) => at = n,
                None => break,
            }
        }
        out
    }
}

const FENCES: [&str; 2] = ["```json", "```"];

/// A reply that is nothing but `{"name": ..., "arguments": ...}` objects; `None` when it is
/// not (finished), or cannot be (unfinished).
fn bare_calls(text: &str, finished: bool) -> Option<ParsedOutput> {
    let t = text.trim_start();
    if !finished && (t.is_empty() || FENCES.iter().any(|f| f.starts_with(t))) {
        return Some(ParsedOutput::default());
    }
    let t = FENCES
        .iter()
        .find_map(|f| t.strip_prefix(f))
        .unwrap_or(t)
        .trim_start();
    if !finished && t.is_empty() {
        return Some(ParsedOutput::default());
    }
    if !t.starts_with('{') {
        return None;
    }
    let mut out = ParsedOutput::default();
    let mut last_end = 0;
    for (start, end) in object_sequence(t, b",;") {
        let obj = &t[start..end.unwrap_or(t.len())];
        // Only an object with both keys is a call: a JSON answer with a "name" is not.
        let (members, _) = object_members(obj);
        let has = |k: &[&str]| members.iter().any(|m| k.contains(&m.key.as_str()));
        let call = (has(&["name"]) && has(&["arguments", "parameters"]))
            .then(|| call_from_object(obj, finished))
            .flatten();
        match call {
            Some(call) => out.tool_calls.push(call),
            None if finished => return None,
            None => break,
        }
        last_end = end.unwrap_or(t.len());
    }
    let rest = t[last_end..].trim();
    if finished && (out.tool_calls.is_empty() || !(rest.is_empty() || rest == "```")) {
        return None;
    }
    Some(out)
}
