//! Gemma 4's calls (vLLM's `gemma4` tool parser): `<|tool_call>call:NAME{args}<tool_call|>`
//! blocks, which may follow the thinking directly, read with it in one pass
//! ([`reasoning::gemma4`](crate::reasoning::gemma4)).

use super::{ParsedOutput, ParsedToolCall, ToolParser};
use crate::reasoning::{gemma4, PromptThinking, ReasoningParserName};
use crate::sampling_params::SamplingParams;

#[derive(Debug)]
pub struct Gemma4ToolParser;

impl ToolParser for Gemma4ToolParser {
    /// A reply whose prompt left no thinking open.
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        self.parse_whole_reply(text, PromptThinking::Absent, finished)
            .unwrap_or_default()
    }

    /// Its markers are special tokens.
    fn adjust_params(&self, params: &mut SamplingParams) {
        params.skip_special_tokens = false;
    }

    fn reply_format(&self) -> Option<ReasoningParserName> {
        Some(ReasoningParserName::Gemma4)
    }

    fn parse_whole_reply(
        &self,
        text: &str,
        prompt: PromptThinking,
        finished: bool,
    ) -> Option<ParsedOutput> {
        let reply = gemma4::read(text, prompt, finished, true);
        Some(ParsedOutput {
            reasoning: reply.reasoning,
            content: reply.content,
            tool_calls: (reply.calls.into_iter())
                .map(|(name, arguments)| ParsedToolCall { name, arguments })
                .collect(),
        })
    }
}
