//! Llama 3.1-3.3's JSON tool calls: the reply is `{"name": ..., "parameters": {...}}`,
//! several separated by `;`, optionally after the `<|python_tag|>` token.

use super::{calls_in_sequence, ParsedOutput, ToolParser};
use crate::sampling_params::SamplingParams;

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, Copy, Default)]
pub struct Llama3JsonToolParser;

impl ToolParser for Llama3JsonToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        let body = text.trim_start();
        let (body, tagged) = match body.strip_prefix(PYTHON_TAG) {
            Some(rest) => (rest.trim_start(), true),
            None => (body, false),
        };
        if !finished && (body.is_empty() || (!tagged && PYTHON_TAG.starts_with(body))) {
            return ParsedOutput::default();
        }
        if !body.starts_with('{') {
            return ParsedOutput::content(text);
        }
        calls_in_sequence(body, b";", finished).unwrap_or_else(|| ParsedOutput::content(text))
    }

    /// `<|python_tag|>` is a special token: it must stay in the text to be seen.
    fn adjust_params(&self, params: &mut SamplingParams) {
        params.skip_special_tokens = false;
    }
}
